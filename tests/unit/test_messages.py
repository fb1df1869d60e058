"""Anthropic's Messages requests → the one generation input (edge/endpoints/messages.py): blocks to chat
messages, tools and tool_choice, thinking, and each refusal naming its place; errors in Anthropic's shape on
its routes only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from edge.endpoints import messages
from edge.endpoints.llm_common import Collected
from edge.errors import OpenAIError, ParamError, from_validation
from tests.support.anthropic_schema import validate_error
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

USAGE = common_pb2.Usage(prompt_tokens=3, completion_tokens=1, total_tokens=4)
CLAUDE_CODE = Path(__file__).parents[1] / "captures" / "claude-code-2.1.328-first-request.json"

TOOL = {"name": "get_time", "description": "The time in a zone.",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
ROUND_TRIP = [
    {"role": "user", "content": "What time is it in Rome?"},
    {"role": "assistant", "content": [{"type": "thinking", "thinking": "Use the tool.", "signature": "s"},
                                      {"type": "text", "text": "Checking."},
                                      {"type": "tool_use", "id": "toolu_1", "name": "get_time",
                                       "input": {"zone": "Europe/Rome"}}]},
    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                  "content": [{"type": "text", "text": "13:00"}]},
                                 {"type": "text", "text": "Thanks."}]},
]


def request(**fields: Any) -> messages.MessagesRequest:
    return messages.MessagesRequest.model_validate({"model": "m", "max_tokens": 64,
                                                    "messages": [{"role": "user", "content": "hi"}], **fields})


def refusal(**fields: Any) -> tuple[str | None, str]:
    """The parameter and message a bad request is refused with (as the edge's error handler reads them)."""
    try:
        messages.generation_input(request(**fields))
    except ValidationError as exc:
        error = from_validation(RequestValidationError(exc.errors(), body=None))
        return error.param, error.message
    except ParamError as exc:
        return exc.param, exc.message
    raise AssertionError("not refused")


def test_a_tool_round_trip_becomes_chat_messages_with_calls_results_and_reasoning() -> None:
    generation = messages.generation_input(request(system=[{"type": "text", "text": "Be brief."}],
                                                   messages=ROUND_TRIP, tools=[TOOL]))
    system, user, assistant, tool, thanks = generation.messages
    assert (system.role, system.content) == ("system", "Be brief.")
    assert (user.role, user.content) == ("user", "What time is it in Rome?")
    assert assistant.content == "Checking." and assistant.reasoning == "Use the tool."
    assert [(c.id, c.name, c.arguments) for c in assistant.tool_calls] == [("toolu_1", "get_time",
                                                                           '{"zone": "Europe/Rome"}')]
    assert (tool.role, tool.tool_call_id, tool.content) == ("tool", "toolu_1", "13:00")
    assert (thanks.role, thanks.content) == ("user", "Thanks.")
    [proto_tool] = generation.proto().chat.tools
    assert proto_tool.name == "get_time" and proto_tool.description == "The time in a zone."
    assert generation.proto().chat.tool_choice.mode == "auto"


def test_consecutive_turns_of_one_role_are_joined() -> None:
    generation = messages.generation_input(request(messages=[{"role": "user", "content": "one"},
                                                             {"role": "user", "content": [{"type": "text",
                                                                                           "text": "two"}]}]))
    [user] = generation.messages
    assert user.content == "one\ntwo"


def test_sampling_stop_sequences_and_names() -> None:
    proto = messages.generation_input(request(temperature=0.5, top_p=0.9, top_k=40, stop_sequences=["\n\n", "END"],
                                              metadata={"user_id": "u1"}, stream=True)).proto()
    assert (proto.max_tokens, proto.top_k, list(proto.stop)) == (64, 40, ["\n\n", "END"])
    assert proto.temperature == pytest.approx(0.5) and proto.top_p == pytest.approx(0.9)
    assert messages.generation_input(request()).param("stop") == "stop_sequences"


@pytest.mark.parametrize(("choice", "mode", "function", "parallel"), [
    ({"type": "auto"}, "auto", "", None),
    ({"type": "any", "disable_parallel_tool_use": True}, "required", "", False),
    ({"type": "tool", "name": "get_time"}, "function", "get_time", None),
    ({"type": "none"}, "none", "", None),
])
def test_tool_choice(choice: dict[str, Any], mode: str, function: str, parallel: bool | None) -> None:
    tooling = messages.generation_input(request(tools=[TOOL], tool_choice=choice)).tooling
    assert (tooling.tool_choice.mode, tooling.tool_choice.function, tooling.parallel) == (mode, function, parallel)


@pytest.mark.parametrize(("thinking", "enabled"), [({"type": "enabled", "budget_tokens": 1024}, True),
                                                   ({"type": "disabled"}, False), (None, None)])
def test_thinking_switches_the_templates_enable_thinking(thinking: Any, enabled: bool | None) -> None:
    proto = messages.generation_input(request(max_tokens=2048, thinking=thinking)).proto()
    assert dict(proto.chat_template_kwargs).get("enable_thinking") == enabled


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"max_tokens": None}, "max_tokens", "max_tokens"),
    ({"messages": []}, "messages", "non-empty"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages[0].role", "top-level 'system'"),
    ({"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}, "messages[0].content[0].type",
     "'video'"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9",
                                                 "content": "x"}]}]}, "messages[0].content[0].tool_use_id",
     "toolu_9"),
    ({"messages": [*ROUND_TRIP[:2], {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_2",
                                                                  "content": "x"}]}]},
     "messages[2].content[0].tool_use_id", "toolu_2"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "file", "file_id": "file_1"}}]}]}, "messages[0].content[0].source", "base64"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "data": "iVBORw0KGgo="}}]}]}, "messages[0].content[0].source.media_type", "string"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_weather"}}, "tool_choice.name", "get_weather"),
    ({"tools": [TOOL], "tool_choice": {"type": "tool"}}, "tool_choice.name", "None"),
    ({"tool_choice": {"type": "any"}}, "tool_choice", "needs 'tools'"),
    ({"tools": [{"name": "x"}]}, "tools[0].input_schema", "input_schema"),
    ({"tools": [TOOL, {"type": ["web_search_20250305"], "name": "web_search"}]}, "tools[1].type", "string"),
    ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens", "1024"),
    ({"max_tokens": 1024, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.budget_tokens",
     "less than"),
    ({"temperature": 1.5}, "temperature", "temperature"),
    ({"stop_sequences": "END"}, "stop_sequences", "array"),
    ({"system": [{"type": "image"}]}, "system[0].type", "text"),
])
def test_bad_input_is_refused_naming_its_place(fields: dict[str, Any], param: str, words: str) -> None:
    body = {key: value for key, value in fields.items() if value is not None}
    if "max_tokens" in fields and fields["max_tokens"] is None:
        with pytest.raises(ValidationError) as missing:
            messages.MessagesRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        error = from_validation(RequestValidationError(missing.value.errors(), body=None))
        assert error.param == "max_tokens" and words in error.message
        return
    found, message = refusal(**body)
    assert found == param and words in message, message


def test_a_stop_string_and_each_finish_give_anthropics_stop_reason() -> None:
    shape = messages.MessageShape()
    head = {"id": "msg-1", "model": "m"}
    for finish, stop, expected in [("stop", "", ("end_turn", None)), ("length", "", ("max_tokens", None)),
                                   ("tool_calls", "", ("tool_use", None)), ("stop", "END", ("stop_sequence", "END"))]:
        choice = Collected()
        choice.add(llm_pb2.Delta(text="x", finish_reason=finish, stop_string=stop))
        answer = shape.response(head, [choice], USAGE)
        assert (answer["stop_reason"], answer["stop_sequence"]) == expected


def test_errors_have_anthropics_shape_on_its_routes_only() -> None:
    error = OpenAIError(404, "The model `x` does not exist.", "model", "model_not_found")
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        body = error.body(path)
        validate_error(body)
        assert body["error"] == {"type": "not_found_error", "message": "The model `x` does not exist."}
    assert error.body("/v1/chat/completions")["error"]["code"] == "model_not_found"
    assert error.body("/v1/messagesx")["error"]["param"] == "model"


def test_image_blocks_become_the_user_messages_pending_images() -> None:
    """Base64 sources as `data:` URLs, URL sources as they are, each under its own parameter; the image
    loader (edge/images.py) checks and loads them before the request goes out."""
    generation = messages.generation_input(messages.MessagesRequest.model_validate({
        "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is this?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}}]}]}))
    [user] = generation.messages
    assert user.content == "What is this?" and not user.images
    assert [(image.message is user, image.url, image.param) for image in generation.images] == [
        (True, "data:image/png;base64,iVBORw0KGgo=", "messages[0].content[1].source.data"),
        (True, "https://example.com/a.jpg", "messages[0].content[2].source.url")]


def test_system_turns_stay_where_they_stand_and_cache_control_changes_nothing() -> None:
    cached = {"cache_control": {"type": "ephemeral", "ttl": "1h"}}
    generation = messages.generation_input(request(system=[{"type": "text", "text": "Be brief.", **cached}], messages=[
        {"role": "user", "content": [{"type": "text", "text": "Hi.", **cached}]},
        {"role": "system", "content": "The user is in Rome."},
        {"role": "assistant", "content": "Ciao."},
        {"role": "system", "content": [{"type": "text", "text": "Answer in English.", **cached}], "clear_at": "never"},
        {"role": "user", "content": "Again?"}], tools=[{**TOOL, **cached}]))
    assert [(m.role, m.content) for m in generation.messages] == [
        ("system", "Be brief."), ("user", "Hi."), ("system", "The user is in Rome."), ("assistant", "Ciao."),
        ("system", "Answer in English."), ("user", "Again?")]


def test_a_system_turn_shown_until_the_next_user_turn_is_left_out_once_one_follows() -> None:
    reminder = {"role": "system", "content": "Reminder.", "clear_at": "next_user_message"}
    later = messages.generation_input(request(messages=[{"role": "user", "content": "one"}, reminder,
                                                        {"role": "user", "content": "two"}]))
    assert [(m.role, m.content) for m in later.messages] == [("user", "one\ntwo")]
    last = messages.generation_input(request(messages=[{"role": "user", "content": "one"}, reminder]))
    assert [m.role for m in last.messages] == ["user", "system"]


@pytest.mark.parametrize(("thinking", "enabled", "shown"), [
    ({"type": "adaptive"}, None, True), ({"type": "adaptive", "display": "omitted"}, None, False),
    ({"type": "adaptive", "display": "summarized"}, None, True),
    ({"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, True, False),
    ({"type": "disabled"}, False, True), (None, None, True)])
def test_thinking_and_its_display(thinking: Any, enabled: bool | None, shown: bool) -> None:
    body = request(max_tokens=2048, thinking=thinking)
    assert dict(messages.generation_input(body).proto().chat_template_kwargs).get("enable_thinking") == enabled
    assert messages.answer_shape(body).thinking_shown is shown


def test_output_config_effort_and_format() -> None:
    proto = messages.generation_input(request(output_config={"effort": "high", "format": {
        "type": "json_schema", "schema": {"type": "object", "properties": {"city": {"type": "string"}}}}})).proto()
    assert dict(proto.chat_template_kwargs) == {"reasoning_effort": "high"}
    assert json.loads(proto.guide.json_schema)["properties"] == {"city": {"type": "string"}}
    assert not messages.generation_input(request(output_config={})).proto().HasField("guide")


def test_max_tokens_is_fitted_to_the_models_room_and_a_count_sends_none() -> None:
    proto = messages.generation_input(request(max_tokens=32000)).proto()
    assert proto.max_tokens == 32000 and proto.fit_max_tokens
    counted = messages.CountTokensRequest.model_validate({"model": "m", "messages": [{"role": "user",
                                                                                      "content": "hi"}]})
    assert not messages.generation_input(counted).proto().fit_max_tokens


@pytest.mark.parametrize(("fields", "param"), [
    ({"thinking": {"type": "between_tools"}}, "thinking"),
    ({"thinking": {"type": "adaptive", "display": "full"}}, "thinking.display"),
    ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
    ({"output_config": "high"}, "output_config"),
    ({"output_config": {"format": {"type": "json_object"}}}, "output_config.format"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": 5}}}}, "output_config.format"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [
        {"type": "image", "source": {"type": "url", "url": "x"}}]}]}, "messages[1].content[0].type"),
    ({"messages": [{"role": "user", "content": "hi", "clear_at": "never"}]}, "messages[0].clear_at"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": "x", "clear_at": "soon"}]},
     "messages[1].clear_at"),
    ({"messages": [{"role": "developer", "content": "hi"}]}, "messages[0].role"),
])
def test_bad_claude_code_fields_are_refused_naming_their_place(fields: dict[str, Any], param: str) -> None:
    assert refusal(**fields)[0] == param


def test_the_answer_to_a_beta_request() -> None:
    """Thinking omitted (its blocks empty, no thinking deltas), the context edits reported, and the prompt tokens
    the backend took from its cache counted as Anthropic counts them."""
    applied = [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 1, "cleared_input_tokens": 0}]
    shape = messages.MessageShape(thinking_shown=False, applied_edits=applied)
    cached = common_pb2.Usage(prompt_tokens=30, completion_tokens=5, total_tokens=35, cached_tokens=20)
    deltas = [llm_pb2.Delta(reasoning="Secret."), llm_pb2.Delta(text="Done.", finish_reason="stop")]
    choice = Collected()
    for delta in deltas:
        choice.add(delta)
    answer = shape.response({"id": "msg_1", "model": "m"}, [choice], cached)
    assert answer["content"] == [{"type": "thinking", "thinking": "", "signature": ""},
                                 {"type": "text", "text": "Done."}]
    assert answer["usage"] == {"input_tokens": 10, "output_tokens": 5, "cache_creation_input_tokens": 0,
                               "cache_read_input_tokens": 20}
    assert answer["context_management"] == {"applied_edits": applied}
    events = shape.events({"id": "msg_1", "model": "m"})
    written = b"".join([*events.start(llm_pb2.Accepted(prompt_tokens=30, choices=1)),
                        *(piece for delta in deltas for piece in events.delta(delta)), *events.end(0, "stop"),
                        *events.finish(cached)]).decode()
    payloads = [json.loads(line[len("data: "):]) for line in written.splitlines() if line.startswith("data: ")]
    assert [p["delta"]["type"] for p in payloads if p["type"] == "content_block_delta"] == ["text_delta"]
    assert payloads[0]["message"]["usage"]["cache_read_input_tokens"] == 0  # known when the generation ends
    assert payloads[-2]["usage"]["cache_read_input_tokens"] == 20
    assert payloads[-2]["context_management"] == {"applied_edits": applied}


def test_claude_codes_first_request_is_taken_whole() -> None:
    """Claude Code 2.1.328's first request as it sent it: system blocks with cache_control, a system turn,
    adaptive thinking with its display omitted, context_management, output_config, max_tokens 32000, a JSON
    user_id and twelve tools, one of them a deferred placeholder."""
    captured = json.loads(CLAUDE_CODE.read_text())["body"]
    body = messages.MessagesRequest.model_validate(captured)
    generation = messages.generation_input(body)
    assert [m.role for m in generation.messages] == ["system", "user", "system"]
    offered = generation.tooling.tools
    assert len(offered) == 11 and "DeferredToolPlaceholder" not in {tool.name for tool in offered}
    proto = generation.proto()
    assert dict(proto.chat_template_kwargs) == {"reasoning_effort": "high"} and proto.fit_max_tokens
    assert proto.max_tokens == 32000 and proto.chat.tool_choice.mode == "auto" and generation.stream
    shape = messages.answer_shape(body)
    assert not shape.thinking_shown and shape.context_management == {"applied_edits": []}
