"""The Responses API as coding agents drive it, on the whole stack through the openai SDK's typed calls:
custom tools (their calls' raw input, streamed as `response.custom_tool_call_input` events), namespaces
(calls answered under the client's `namespace` and `name`), hosted tools (accepted, never offered), a later
turn replayed statelessly or continued with `previous_response_id`, encrypted reasoning, Codex CLI's own
first request, a stream that fails after it started, and a forced custom tool whose Lark grammar the real
demo SmolLM2 behind TensorRT-LLM's interface must follow (guided decoding).

`ft-echo-hermes` repeats the last message as the model's whole output through the Hermes tool-call parser
(tests/triton_models/README.md), so a test's message is the model's answer: a call of a custom tool is
written `{"name": ..., "arguments": {"input": ...}}`, as a model is shown it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import lark
import openai
import pytest
from openai.types.responses import ResponseCustomToolCall, ResponseFunctionToolCall, ToolParam

from launcher.stack import DEMO_LLMS
from tests.e2e.test_responses import EVENT_SCHEMAS
from tests.support.openai_schema import validate
from tests.support.streams import stream_events

HERMES = "ft-echo-hermes"
GUIDED = DEMO_LLMS["tensorrt_llm"]  # the real SmolLM2, whose backend enforces grammars
CODEX_REQUEST = Path(__file__).parents[1] / "unit" / "data" / "codex_request.json"
PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello, world!\n*** End Patch\n"
TOOLS: list[ToolParam] = [
    {"type": "function", "name": "exec_command", "parameters": {"type": "object", "properties": {
        "cmd": {"type": "string"}}}, "strict": False},
    {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch.",
     "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch\\n" /(.|\\n)+/'}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "close_agent", "parameters": {"type": "object", "properties": {
            "target": {"type": "string"}}}, "strict": False}]},
    {"type": "web_search"},
]


def said(output: dict[str, Any] | str) -> str:
    """The model's whole answer, written as a Hermes model writes a call (or text as it is)."""
    return output if isinstance(output, str) else f"<tool_call>\n{json.dumps(output)}\n</tool_call>"


def payloads(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """A stream's events, each checked against OpenAI's schemas; it ends with [DONE]."""
    events = stream_events(http, "/v1/responses", {**body, "stream": True})
    assert events[-1].data == "[DONE]" and all(event.name != "error" for event in events)
    parsed = [json.loads(event.data) for event in events[:-1]]
    for event, payload in zip(events, parsed, strict=False):
        assert event.name == payload["type"]
        validate(payload, EVENT_SCHEMAS.get(payload["type"], "ResponseStreamEvent"))
        validate(payload, "ResponseStreamEvent")
    assert [payload["sequence_number"] for payload in parsed] == list(range(len(parsed)))
    return parsed


def test_a_custom_tools_call_is_a_custom_tool_call_item_with_its_raw_input(client: openai.OpenAI) -> None:
    response = client.responses.create(model=HERMES, tools=TOOLS, input=said(
        {"name": "apply_patch", "arguments": {"input": PATCH}}))
    [call] = response.output
    assert isinstance(call, ResponseCustomToolCall)
    assert (call.name, call.input, call.namespace) == ("apply_patch", PATCH, None)
    assert call.call_id.startswith("call_") and call.id is not None and call.id.startswith("ctc_")
    validate(response.model_dump(mode="json", exclude_unset=True), "Response")
    assert [tool.type for tool in response.tools] == ["function", "custom", "namespace", "web_search"]


def test_a_namespaced_functions_call_names_its_namespace(client: openai.OpenAI) -> None:
    response = client.responses.create(model=HERMES, tools=TOOLS, input=said(
        {"name": "multi_agent_v1.close_agent", "arguments": {"target": "agent-1"}}))
    [call] = response.output
    assert isinstance(call, ResponseFunctionToolCall)
    assert (call.name, call.namespace, json.loads(call.arguments)) == ("close_agent", "multi_agent_v1",
                                                                       {"target": "agent-1"})


def test_a_streamed_custom_call_comes_as_input_events_with_the_same_item_id(client: openai.OpenAI,
                                                                            http: httpx.Client) -> None:
    body = {"model": HERMES, "tools": TOOLS, "input": said({"name": "apply_patch", "arguments": {"input": PATCH}})}
    events = payloads(http, body)
    kinds = [event["type"] for event in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.custom_tool_call_input.done", "response.output_item.done", "response.completed"]
    assert set(kinds[3:-3]) == {"response.custom_tool_call_input.delta"}
    added, done, item_done, completed = events[2], events[-3], events[-2], events[-1]["response"]
    assert "".join(event["delta"] for event in events[3:-3]) == done["input"] == PATCH
    assert added["item"]["id"] == done["item_id"] == item_done["item"]["id"] == completed["output"][0]["id"]
    assert completed["output"] == [item_done["item"]] and item_done["item"]["type"] == "custom_tool_call"

    with client.responses.stream(model=HERMES, tools=TOOLS, input=body["input"]) as stream:
        deltas = [event.delta for event in stream if event.type == "response.custom_tool_call_input.delta"]
        final = stream.get_final_response()
    assert "".join(deltas) == PATCH and isinstance(final.output[0], ResponseCustomToolCall)


def test_an_agents_next_turn_replays_its_items_or_continues_the_stored_response(client: openai.OpenAI) -> None:
    """Codex sends the whole history back (store: false); the output of a custom call reaches the model."""
    ask = said({"name": "apply_patch", "arguments": {"input": PATCH}})
    first = client.responses.create(model=HERMES, tools=TOOLS, input=ask, store=False)
    call = first.output[0]
    assert isinstance(call, ResponseCustomToolCall)
    result = {"type": "custom_tool_call_output", "call_id": call.call_id, "output": "Success. Updated hello.txt"}
    history = [{"type": "message", "role": "developer", "content": "You are a coding agent."},
               {"role": "user", "content": ask}, call.model_dump(exclude_none=True), result,
               {"type": "message", "role": "developer", "content": "Answer briefly."},
               {"role": "user", "content": "Success. Updated hello.txt"}]
    stateless = client.responses.create(model=HERMES, tools=TOOLS, input=history)  # type: ignore[arg-type]
    assert stateless.output_text == "Success. Updated hello.txt"

    stored = client.responses.create(model=HERMES, tools=TOOLS, input=ask)
    [stored_call] = stored.output
    assert isinstance(stored_call, ResponseCustomToolCall)
    second = client.responses.create(model=HERMES, tools=TOOLS, previous_response_id=stored.id, input=[
        {"type": "custom_tool_call_output", "call_id": stored_call.call_id, "output": "Success."}])
    assert second.status == "completed" and "Success." in second.output_text


def test_reasoning_items_carry_our_encrypted_content_which_a_later_turn_sends_back(client: openai.OpenAI) -> None:
    answer = "<think>\nThe user wants a greeting.\n</think>\n\nHello!"
    first = client.responses.create(model="ft-echo-think", input=answer, include=["reasoning.encrypted_content"],
                                    store=False)
    reasoning, message = first.output
    assert reasoning.type == "reasoning" and reasoning.encrypted_content is not None
    assert reasoning.encrypted_content.startswith("tg1:") and message.type == "message"
    replayed = [{"role": "user", "content": answer}, {**reasoning.model_dump(exclude_none=True), "content": []},
                message.model_dump(exclude_none=True),
                {"type": "reasoning", "id": "rs_other", "summary": [], "encrypted_content": "gAAAAABnot-ours"},
                {"role": "user", "content": "Bye."}]
    second = client.responses.create(model="ft-echo-think", input=replayed)  # type: ignore[arg-type]
    assert second.output_text == "Bye."


def test_hosted_tools_are_accepted_and_never_offered(client: openai.OpenAI) -> None:
    response = client.responses.create(model=HERMES, input="No tools needed.",
                                       tools=[{"type": "web_search"}, {"type": "image_generation"}])
    assert response.output_text == "No tools needed." and response.tool_choice == "auto"
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=HERMES, input="hi", tools=TOOLS, tool_choice={"type": "web_search_preview"})
    assert refused.value.body["param"] == "tool_choice"  # type: ignore[index]


def test_codex_clis_first_request_is_served(http: httpx.Client) -> None:
    """Codex CLI 0.169's first request as it sent it (developer messages, a namespace, a hosted web search,
    encrypted reasoning asked for, client_metadata, ...), to a model that answers its last message."""
    body = {**json.loads(CODEX_REQUEST.read_text()), "model": HERMES}
    events = payloads(http, body)
    completed = events[-1]["response"]
    assert events[-1]["type"] == "response.completed" and completed["store"] is False
    assert completed["output"][-1]["content"][0]["text"] == "list the files here"
    assert completed["prompt_cache_key"] == body["prompt_cache_key"] and completed["parallel_tool_calls"] is True
    response = http.post("/v1/responses", json={**body, "stream": False})
    assert response.status_code == 200, response.text
    validate(response.json(), "Response")


def test_a_stream_that_fails_after_it_started_ends_with_response_failed(http: httpx.Client) -> None:
    events = stream_events(http, "/v1/responses", {"model": "ft-echo-failing", "input": "one two three four five",
                                                   "stream": True})
    assert events[-1].data == "[DONE]" and all(event.name != "error" for event in events)
    failed = json.loads(events[-2].data)
    validate(failed, "ResponseFailedEvent")
    assert failed["response"]["status"] == "failed" and failed["response"]["error"]["code"] == "server_error"
    assert json.loads(events[0].data)["response"]["id"] == failed["response"]["id"]


BAD = [
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark",
                                                           "definition": "start: undefined_rule"}}]},
     "tools[0].format.definition", "does not parse"),
    ({"tools": [{"type": "custom", "name": "p", "format": {"type": "grammar", "syntax": "lark",
                                                           "definition": 'start: "a"\n%ignore " "'}}]},
     "tools[0].format.definition", "%ignore is not supported"),
    ({"tools": [{"type": "namespace", "name": "ns", "description": "d", "tools": []}]}, "tools[0].tools",
     "at least one tool"),
    ({"tools": [{"type": "function", "name": "ns"}, {"type": "namespace", "name": "ns", "description": "d",
                                                     "tools": [{"type": "function", "name": "f"}]}]},
     "tools[1].name", "more than once"),
    ({"tools": TOOLS, "tool_choice": {"type": "custom", "name": "nope"}}, "tool_choice", "'nope'"),
]


@pytest.mark.parametrize(("body", "param", "says"), BAD, ids=[case[1] for case in BAD])
def test_bad_agent_input_is_a_400_naming_it(http: httpx.Client, body: dict[str, Any], param: str, says: str) -> None:
    response = http.post("/v1/responses", json={"model": HERMES, "input": "hi", **body})
    assert response.status_code == 400, response.text
    validate(response.json(), "ErrorResponse")
    assert response.json()["error"]["param"] == param and says in response.json()["error"]["message"]


# A forced custom tool on the real SmolLM2: guided decoding holds its input to the grammar, whatever the
# model would write. The language is finite, so the model ends well within the token budget.
COMMAND_GRAMMAR = '''start: command (" && " command)?
command: "ls" | "pwd" | "echo " WORD
WORD: /[a-z]{1,8}/
'''
COMMAND_TOOL: ToolParam = {"type": "custom", "name": "shell", "description": "Run a shell command.",
                           "format": {"type": "grammar", "syntax": "lark", "definition": COMMAND_GRAMMAR}}
FORCED: dict[str, Any] = {"model": GUIDED, "input": "List the files in this folder.", "tools": [COMMAND_TOOL],
                          "tool_choice": {"type": "custom", "name": "shell"}, "temperature": 0,
                          "max_output_tokens": 48}


def test_a_forced_custom_tools_input_follows_its_lark_grammar_streamed_and_not(client: openai.OpenAI,
                                                                               http: httpx.Client) -> None:
    parser = lark.Lark(COMMAND_GRAMMAR)
    response = client.responses.create(**FORCED)
    [call] = response.output
    assert isinstance(call, ResponseCustomToolCall) and call.name == "shell" and response.status == "completed"
    parser.parse(call.input)  # raises unless the grammar takes it
    events = payloads(http, FORCED)
    [done] = [event for event in events if event["type"] == "response.custom_tool_call_input.done"]
    parser.parse(done["input"])
    assert done["input"] == events[-1]["response"]["output"][0]["input"]
    assert "".join(event["delta"] for event in events if event["type"] == "response.custom_tool_call_input.delta") \
        == done["input"]


def test_a_forced_custom_tools_input_matches_its_regular_expression(client: openai.OpenAI) -> None:
    pattern = r"(ls|pwd)( -[la]{1,2})?"
    tool: ToolParam = {"type": "custom", "name": "shell", "format": {"type": "grammar", "syntax": "regex",
                                                                     "definition": pattern}}
    response = client.responses.create(**{**FORCED, "tools": [tool]})
    [call] = response.output
    assert isinstance(call, ResponseCustomToolCall) and re.fullmatch(pattern, call.input), call.input
