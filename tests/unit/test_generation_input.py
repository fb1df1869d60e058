"""The one generation input: what each front end converts into, its rules under the front end's names, and
the GenerateRequest it becomes."""

from __future__ import annotations

import json

from edge.endpoints import chat, completions, interactive, responses
from edge.generation import GenerationInput, SamplingRequest, Tooling
from tritongate.llm.v1 import llm_pb2

TOOL = llm_pb2.Tool(name="f")
FORCED = llm_pb2.ToolChoice(mode="required")


def test_a_forced_call_and_a_format_travel_together() -> None:
    """The Agents SDK's pattern: the forced turn is held to the call's grammar by the service, the format
    is for the answer after the tool's result; both reach the service."""
    proto = GenerationInput(model="m", sampling=SamplingRequest(), tooling=Tooling(
        [TOOL], FORCED, guide=llm_pb2.Guide(json_object=True))).proto()
    assert proto.chat.tool_choice.mode == "required" and proto.guide.json_object
    answer = responses.generation_input(responses.ResponseRequest.model_validate({
        "model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}], "tool_choice": "required",
        "text": {"format": {"type": "json_object"}}}), []).proto()
    assert answer.chat.tool_choice.mode == "required" and answer.guide.json_object


def test_sampling_leaves_unset_fields_to_the_model_and_carries_large_seeds_as_int64() -> None:
    proto = GenerationInput(model="m", sampling=SamplingRequest(seed=2**64 - 1, top_k=-1, stop=["x"])).proto()
    assert proto.seed == -1 and proto.top_k == 0 and list(proto.stop) == ["x"] and proto.n == 1
    for field in ("temperature", "top_p", "max_tokens", "repetition_penalty", "do_sample"):
        assert not proto.HasField(field), field


def test_a_conversation_or_prompts_one_input() -> None:
    chat = GenerationInput(model="m", sampling=SamplingRequest(),
                           messages=[llm_pb2.ChatMessage(role="user", content="hi")], tooling=Tooling([TOOL])).proto()
    assert chat.WhichOneof("input") == "chat" and chat.chat.tool_choice.mode == "auto"
    assert not chat.chat.HasField("parallel_tool_calls")
    prompts = GenerationInput(model="m", sampling=SamplingRequest(), prompts=[llm_pb2.Prompt(text="x")],
                              echo=True).proto()
    assert prompts.WhichOneof("input") == "prompts" and prompts.echo


def test_responses_convert_straight_into_the_input() -> None:
    fields = {
        "model": "m", "instructions": "Be brief.", "input": [{"role": "developer", "content": "Use metric."},
                                                             {"role": "user", "content": "hi"}],
        "max_output_tokens": 5, "temperature": 0, "parallel_tool_calls": False,
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "tool_choice": "auto", "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}}}
    body = responses.ResponseRequest.model_validate(fields)
    history = [llm_pb2.ChatMessage(role="user", content="before")]
    proto = responses.generation_input(body, history).proto()
    assert [(m.role, m.content) for m in proto.chat.messages] == [
        ("system", "Be brief."), ("user", "before"), ("system", "Use metric."), ("user", "hi")]
    assert proto.max_tokens == 5 and proto.HasField("temperature") and proto.chat.parallel_tool_calls is False
    assert [t.name for t in proto.chat.tools] == ["f"] and proto.chat.tool_choice.mode == "auto"
    named = responses.ResponseRequest.model_validate({**fields, "tool_choice": {"type": "function", "name": "f"},
                                                     "text": None})
    assert responses.generation_input(named, []).proto().chat.tool_choice.function == "f"
    assert proto.guide.json_schema == '{"type":"object"}'


def test_interactive_turns_convert_straight_into_the_input() -> None:
    body = interactive.InteractiveRequest.model_validate({"prompt": "again", "request_output_len": 3, "top_k": 40,
                                                          "stop": "x", "seed": 7})
    session = interactive.Session("m", [llm_pb2.ChatMessage(role="user", content="hi"),
                                        llm_pb2.ChatMessage(role="assistant", content="yo")])
    generation = interactive.generation_input(body, session)
    proto = generation.proto()
    assert [m.content for m in proto.chat.messages] == ["hi", "yo", "again"]
    assert (proto.max_tokens, proto.top_k, list(proto.stop), proto.seed) == (3, 40, ["x"], 7)
    assert generation.param("max_tokens") == "request_output_len" and generation.param("n") == "n"


def test_a_session_is_stored_as_the_generations_own_messages() -> None:
    """Read back with no validation; one stored by the previous version (JSON) reads back the same."""
    session = interactive.Session("m", [llm_pb2.ChatMessage(role="user", content="hi"),
                                        llm_pb2.ChatMessage(role="assistant", content="yo")], tokens=5)
    assert interactive.Session.decoded(session.encoded()) == session
    previous = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"},
                                                      {"role": "assistant", "content": "yo"}], "tokens": 5})
    assert interactive.Session.decoded(previous.encode()) == session


def test_num_beams_and_best_of_with_use_beam_search_become_the_beam_width() -> None:
    beams = chat.generation_input(chat.ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "num_beams": 4, "n": 2}))
    assert beams.proto().beam_width == 4 and beams.proto().n == 2
    assert chat.generation_input(chat.ChatCompletionRequest.model_validate({
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "num_beams": 1})).proto().beam_width == 0
    legacy = completions.generation_input(completions.CompletionRequest.model_validate({
        "model": "m", "prompt": "x", "use_beam_search": True, "best_of": 3, "n": 2}))
    assert legacy.proto().beam_width == 3 and legacy.param("num_beams") == "best_of"  # refusals name best_of
    default = completions.generation_input(completions.CompletionRequest.model_validate({
        "model": "m", "prompt": "x", "use_beam_search": True, "n": 2}))
    assert default.proto().beam_width == 2
