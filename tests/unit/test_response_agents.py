"""The Responses API as coding agents use it (Codex CLI): custom tools and their grammars, namespaces,
hosted tools, `tool_choice` naming them, the input items of a later turn (custom calls, reasoning with
our `encrypted_content`), the names the model's calls come back under, the stored conversation, the
echoed fields, `response.failed`, and every bad input refused with its exact parameter."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from edge.endpoints.encrypted_content import encrypted_content, thinking_of
from edge.endpoints.llm_common import Collected
from edge.endpoints.response_input import input_messages
from edge.endpoints.response_output import ResponseRecorder
from edge.endpoints.responses import ResponseRequest, Stored, generation_input
from edge.errors import OpenAIError, from_validation
from edge.state import Limits
from edge.state.memory import MemoryStore
from tests.support.openai_schema import validate
from tests.support.streams import parse_events
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# Codex CLI 0.169's first request (`codex exec`, its body as the edge received it).
CODEX_REQUEST = Path(__file__).parent / "data" / "codex_request.json"
HEAD = {"id": "resp-1", "created": 1, "model": "m"}
USAGE = common_pb2.Usage(prompt_tokens=5, completion_tokens=9, total_tokens=14, cached_tokens=4)
PATCH_GRAMMAR = 'start: "*** Begin Patch\\n" LINE* "*** End Patch"\nLINE: /[+ -][^\\n]*\\n/\n'
PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": PATCH_GRAMMAR}}
EXEC = {"type": "function", "name": "exec_command", "parameters": {"type": "object"}}
AGENTS = {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
    {"type": "function", "name": "close_agent", "parameters": {"type": "object"}},
    {"type": "custom", "name": "note"}]}
TOOLS = [EXEC, PATCH, AGENTS, {"type": "web_search", "external_web_access": False}]


def request(**fields: Any) -> ResponseRequest:
    return ResponseRequest.model_validate({"model": "m", "input": "hi", **fields})


def refusal(**fields: Any) -> OpenAIError:
    """The 400 that the request `fields` gets, as the client sees it."""
    with pytest.raises(ValidationError) as info:
        request(**fields)
    return from_validation(RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]))


def test_each_tool_is_offered_under_the_name_the_model_calls_it_and_hosted_tools_never() -> None:
    body = request(tools=TOOLS)
    tools = body.tooling.tools
    assert [tool.name for tool in tools] == ["exec_command", "apply_patch", "multi_agent_v1.close_agent",
                                             "multi_agent_v1.note"]
    assert [tool.custom for tool in tools] == [False, True, False, True]
    assert tools[1].grammar.grammar.startswith("root ::=") and not tools[3].HasField("grammar")
    proto = generation_input(body, []).proto()
    assert [(tool.type, tool.param) for tool in proto.hosted_tools] == [("web_search", "tools[3]")]
    assert body.request_tools.called("multi_agent_v1.note") == ("note", "multi_agent_v1", True)
    assert body.request_tools.called("unknown") == ("unknown", None, False)
    regex = request(tools=[{**PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": r"\d+"}}])
    assert regex.tooling.tools[0].grammar.regex == r"\d+"  # the engine takes the expression itself


def test_tool_choice_names_a_custom_tool_a_namespaced_one_or_a_set_of_allowed_tools() -> None:
    assert request(tools=TOOLS, tool_choice={"type": "custom", "name": "apply_patch"}).tooling.choice == \
        llm_pb2.ToolChoice(mode="function", function="apply_patch")
    namespaced = request(tools=TOOLS, tool_choice={"type": "function", "name": "close_agent",
                                                   "namespace": "multi_agent_v1"})
    assert namespaced.tooling.choice.function == "multi_agent_v1.close_agent"
    allowed = request(tools=TOOLS, tool_choice={"type": "allowed_tools", "mode": "required", "tools": [
        {"type": "function", "name": "exec_command"}, {"type": "web_search"}]})
    assert [tool.name for tool in allowed.tooling.tools] == ["exec_command"]
    assert allowed.tooling.choice.mode == "required"
    assert request(tools=[TOOLS[3]]).tooling.choice.mode == "none"  # only a hosted tool: nothing to call


def test_max_tool_calls_1_turns_parallel_calls_off_and_the_response_echoes_the_agents_fields() -> None:
    body = request(tools=TOOLS, max_tool_calls=1, prompt_cache_key="k", safety_identifier="s", service_tier="flex",
                   truncation="auto", text={"verbosity": "high"}, client_metadata={"turn_id": "t"},
                   include=["reasoning.encrypted_content"], store=False)
    assert body.tooling.parallel is False and generation_input(body, []).proto().chat.parallel_tool_calls is False
    choice = Collected()
    choice.add(llm_pb2.Delta(text="ok", finish_reason="stop"))
    response = ResponseRecorder(body, [], MemoryStore().space("r", Limits(10, 60))).response(HEAD, [choice], USAGE)
    validate(response, "Response")
    assert {key: response[key] for key in ("max_tool_calls", "prompt_cache_key", "safety_identifier", "service_tier",
                                           "truncation", "parallel_tool_calls", "text")} == {
        "max_tool_calls": 1, "prompt_cache_key": "k", "safety_identifier": "s", "service_tier": "flex",
        "truncation": "auto", "parallel_tool_calls": False, "text": {"format": {"type": "text"}, "verbosity": "high"}}
    assert response["usage"]["input_tokens_details"]["cached_tokens"] == 4
    assert "client_metadata" not in response  # not a field of OpenAI's Response


def test_codex_clis_first_request_is_accepted_whole() -> None:
    body = request(**{**json.loads(CODEX_REQUEST.read_text()), "model": "m"})
    names = [tool.name for tool in body.tooling.tools]
    assert "exec_command" in names and "multi_agent_v1.close_agent" in names
    assert [tool.type for tool in body.request_tools.hosted] == ["web_search"]
    assert body.encrypted_reasoning and body.messages[0].role == "system"  # a developer message


def calls(*pieces: tuple[str, str, str]) -> Collected:
    choice = Collected()
    choice.add(llm_pb2.Delta(reasoning="I should patch."))
    for index, (call_id, name, arguments) in enumerate(pieces):
        choice.add(llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=index, id=call_id, name=name,
                                                                   arguments=arguments)]))
    choice.add(llm_pb2.Delta(finish_reason="tool_calls"))
    return choice


async def test_calls_come_back_under_the_clients_names_and_the_stored_conversation_keeps_them() -> None:
    store = MemoryStore().space("r", Limits(10, 60))
    recorder = ResponseRecorder(request(tools=TOOLS, include=["reasoning.encrypted_content"]), [], store)
    answer = calls(("call_p", "apply_patch", "*** Begin Patch\n*** End Patch"),
                   ("call_c", "multi_agent_v1.close_agent", '{"target": "a"}'), ("call_n", "multi_agent_v1.note", ""))
    response = recorder.response(HEAD, [answer], USAGE)
    validate(response, "Response")
    thinking, patch, close, note = response["output"]
    assert thinking["encrypted_content"].startswith("tg1:") and thinking_of(thinking["encrypted_content"]) == \
        "I should patch."
    assert patch == {"id": patch["id"], "type": "custom_tool_call", "call_id": "call_p", "name": "apply_patch",
                     "input": "*** Begin Patch\n*** End Patch"} and patch["id"].startswith("ctc_")
    assert (close["type"], close["name"], close["namespace"]) == ("function_call", "close_agent", "multi_agent_v1")
    assert (note["type"], note["name"], note["namespace"], note["input"]) == (
        "custom_tool_call", "note", "multi_agent_v1", "")
    await recorder.persist()
    value = await store.get("resp-1")
    assert value is not None
    conversation = Stored.decoded(value).conversation
    assert conversation is not None
    assert conversation[-1].reasoning == "I should patch."
    assert [(c.name, c.arguments, c.custom) for c in conversation[-1].tool_calls] == [
        ("apply_patch", "*** Begin Patch\n*** End Patch", True),
        ("multi_agent_v1.close_agent", '{"target": "a"}', False), ("multi_agent_v1.note", "", True)]


def test_a_later_turns_items_are_the_same_conversation_as_the_stored_one() -> None:
    """Codex replays its history statelessly: the output items sent back as input read as the stored
    conversation does (our encrypted_content giving the thinking back)."""
    recorder = ResponseRecorder(request(tools=TOOLS, include=["reasoning.encrypted_content"], store=False), [],
                                MemoryStore().space("r", Limits(10, 60)))
    output = recorder.response(HEAD, [calls(("call_p", "apply_patch", "*** Begin Patch\n*** End Patch"),
                                            ("call_c", "multi_agent_v1.close_agent", "{}"))], USAGE)["output"]
    output[0] = {**output[0], "content": []}  # what Codex keeps of a reasoning item: its encrypted_content
    items = [{"type": "message", "role": "developer", "content": "Be careful."}, {"role": "user", "content": "go"},
             *output, {"type": "custom_tool_call_output", "call_id": "call_p", "output": "Done!"},
             {"type": "function_call_output", "call_id": "call_c", "output": "closed"},
             {"type": "message", "role": "developer", "content": "Summarise."}]
    messages = input_messages(items).messages
    assert [m.role for m in messages] == ["system", "user", "assistant", "tool", "tool", "system"]
    answer = messages[2]
    assert answer.reasoning == "I should patch."
    assert [(c.id, c.name, c.custom) for c in answer.tool_calls] == [
        ("call_p", "apply_patch", True), ("call_c", "multi_agent_v1.close_agent", False)]
    assert (messages[3].tool_call_id, messages[3].content) == ("call_p", "Done!")


@pytest.mark.parametrize(("encrypted", "content", "thinking"), [
    (encrypted_content("ours ü"), [], "ours ü"),
    ("gAAAAABo-openais-own", [{"type": "reasoning_text", "text": "shown"}], "shown"),  # another server's: its content
    ("tg1:not base64 ~~", [], None), ("tg1:" + encrypted_content("x")[4:-4], [], None),  # broken: ignored
    (None, [{"type": "reasoning_text", "text": "a"}, {"type": "reasoning_text", "text": "b"}], "a\nb"),
])
def test_reasoning_items_give_the_next_answer_its_thinking(encrypted: str | None, content: list[Any],
                                                           thinking: str | None) -> None:
    item = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "s"}],
            "encrypted_content": encrypted, "content": content}
    messages = input_messages([{"role": "user", "content": "hi"}, item,
                               {"type": "message", "role": "assistant", "content": "hello"}]).messages
    assert messages[-1].reasoning == (thinking or "")


def test_an_encrypted_content_round_trips_and_nothing_else_reads_as_ours() -> None:
    for text in ("", "short", "long " * 10_000, "ünïcödé\n<think>"):
        assert thinking_of(encrypted_content(text)) == text
    bomb = encrypted_content("a" * (5 * 1024 * 1024))  # inflates beyond any thinking: not ours
    assert len(bomb) < 10_000 and thinking_of(bomb) is None
    for other in (None, 3, "", "tg1:", "tg2:eJwLyUhVKC1O", "tg1:eJwLyUhVKC1O=="):
        assert thinking_of(other) is None


LARK_IGNORE = 'start: "a"\n%ignore " "'
BAD = [
    ({"tools": [{**PATCH, "format": {**PATCH["format"], "definition": "start: foo"}}]},
     "tools[0].format.definition", "does not parse"),
    ({"tools": [EXEC, {**PATCH, "format": {**PATCH["format"], "definition": LARK_IGNORE}}]},
     "tools[1].format.definition", "%ignore is not supported"),
    ({"tools": [{**PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": "(?=a)a"}}]},
     "tools[0].format.definition", "lookahead"),
    ({"tools": [{**PATCH, "format": {"type": "grammar", "syntax": "regex", "definition": "("}}]},
     "tools[0].format.definition", "does not parse"),
    ({"tools": [{**PATCH, "format": {"type": "grammar", "syntax": "ebnf", "definition": "x"}}]},
     "tools[0].format.syntax", "'lark' or 'regex'"),
    ({"tools": [{**PATCH, "format": {"type": "json"}}]}, "tools[0].format", "'text' or 'grammar'"),
    ({"tools": [{**PATCH, "name": "apply patch"}]}, "tools[0].name", "letters, digits"),
    ({"tools": [{**AGENTS, "tools": []}]}, "tools[0].tools", "at least one tool"),
    ({"tools": [{**AGENTS, "tools": [{"type": "web_search"}]}]}, "tools[0].tools[0].type", "'function' and 'custom'"),
    ({"tools": [{**AGENTS, "tools": [EXEC, EXEC]}]}, "tools[0].tools[1].name", "more than once"),
    ({"tools": [{**EXEC, "name": "multi_agent_v1"}, AGENTS]}, "tools[1].name", "more than once"),
    ({"tools": [EXEC, {**PATCH, "name": "exec_command"}]}, "tools[1].name", "more than once"),
    ({"tools": [{"name": "f"}]}, "tools[0].type", "'type'"),
    ({"tools": TOOLS, "tool_choice": {"type": "web_search"}}, "tool_choice", "cannot run here"),
    ({"tools": TOOLS, "tool_choice": {"type": "custom", "name": "exec_command"}}, "tool_choice", "custom tool"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "apply_patch"}}, "tool_choice", "not in 'tools'"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "close_agent"}}, "tool_choice", "not in 'tools'"),
    ({"tools": TOOLS, "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [
        {"type": "function", "name": "nope"}]}}, "tool_choice.tools[0]", "'nope'"),
    ({"tools": [TOOLS[3]], "tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"safety_identifier": "x" * 65}, "safety_identifier", "64"),
    ({"service_tier": "gold"}, "service_tier", ""),
    ({"text": {"verbosity": "loud"}}, "text.verbosity", ""),
    ({"max_tool_calls": 0}, "max_tool_calls", ""),
    ({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": 3}]}, "input[0].input",
     "string"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}", "namespace": ""}]},
     "input[0].namespace", "non-empty"),
    ({"input": [{"type": "custom_tool_call_output", "output": "x"}]}, "input[0].call_id", "non-empty"),
    ({"input": [{"type": "reasoning", "content": "thought"}]}, "input[0].content", "reasoning_text"),
]


@pytest.mark.parametrize(("fields", "param", "says"), BAD, ids=[case[1] + " " + case[2] for case in BAD])
def test_bad_input_is_a_400_naming_its_parameter(fields: dict[str, Any], param: str, says: str) -> None:
    error = refusal(**fields)
    assert (error.status, error.param) == (400, param), error.message
    assert says in error.message


async def test_a_stream_that_fails_after_it_started_ends_with_response_failed_then_done() -> None:
    recorder = ResponseRecorder(request(tools=TOOLS, stream=True), [], MemoryStore().space("r", Limits(10, 60)))
    events = recorder.events(HEAD)

    async def generation() -> AsyncGenerator[bytes, None]:
        yield b"".join(events.start(llm_pb2.Accepted(choices=1)))
        yield b"".join(events.delta(llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(
            index=0, id="call_p", name="apply_patch", arguments="*** Begin")])))
        raise OpenAIError(503, "The llm service is unavailable.")

    sent: list[bytes] = []

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message.get("body", b""))

    scope = {"type": "http", "method": "POST", "path": "/v1/responses", "headers": []}
    await asyncio.wait_for(recorder.event_stream(generation(), 10.0)(scope, receive, send), 5)
    parsed = parse_events(b"".join(sent).decode())
    assert parsed[-1].data == "[DONE]" and "error" not in [event.name for event in parsed]
    failed = json.loads(parsed[-2].data)
    validate(failed, "ResponseFailedEvent")
    assert failed["response"]["status"] == "failed" and failed["response"]["error"] == {
        "code": "server_error", "message": "The llm service is unavailable."}
    assert failed["response"]["output"][0]["input"] == "*** Begin"
    assert [json.loads(event.data)["sequence_number"] for event in parsed[:-1]] == list(range(len(parsed) - 1))
