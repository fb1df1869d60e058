"""POST /v1/responses and GET /v1/responses/{id} on the whole stack: the openai SDK's `responses.create`
and `responses.stream`, the event sequence and every response against OpenAI's schemas, stored
conversations, and bad input."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.openai_schema import validate
from tests.support.streams import stream_events

SMOLLM2 = "smollm2-135m-instruct"
ECHO = "ft-echo"
FRANCE = "What is the capital of France?"
OPENING = ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
# Each event type this server sends and its schema (ResponseStreamEvent is the union of them all).
EVENT_SCHEMAS = {"response.created": "ResponseCreatedEvent", "response.in_progress": "ResponseInProgressEvent",
                 "response.output_item.added": "ResponseOutputItemAddedEvent",
                 "response.content_part.added": "ResponseContentPartAddedEvent",
                 "response.output_text.delta": "ResponseTextDeltaEvent",
                 "response.output_text.done": "ResponseTextDoneEvent",
                 "response.content_part.done": "ResponseContentPartDoneEvent",
                 "response.output_item.done": "ResponseOutputItemDoneEvent",
                 "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
                 "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
                 "response.custom_tool_call_input.delta": "ResponseCustomToolCallInputDeltaEvent",
                 "response.custom_tool_call_input.done": "ResponseCustomToolCallInputDoneEvent",
                 "response.completed": "ResponseCompletedEvent", "response.incomplete": "ResponseIncompleteEvent",
                 "response.failed": "ResponseFailedEvent"}
CLOSING = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def test_responses_create_answers_paris(client: openai.OpenAI, http: httpx.Client) -> None:
    response = client.responses.create(model=SMOLLM2, input=FRANCE, temperature=0, max_output_tokens=12)
    assert "Paris" in response.output_text
    assert response.status in ("completed", "incomplete") and response.model == SMOLLM2
    assert response.usage is not None and response.usage.input_tokens > 5 and response.usage.output_tokens > 0
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    stored = http.get(f"/v1/responses/{response.id}").json()
    validate(stored, "Response")
    assert stored["output"][0]["content"][0]["text"] == response.output_text


def test_responses_stream_answers_paris_token_by_token(client: openai.OpenAI) -> None:
    with client.responses.stream(model=SMOLLM2, input=[{"role": "user", "content": FRANCE}], temperature=0,
                                 max_output_tokens=12) as stream:
        kinds, deltas = [], []
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.output_text.delta":
                deltas.append(event.delta)
        final = stream.get_final_response()
    assert len(deltas) > 1 and "Paris" in "".join(deltas)
    assert final.output_text == "".join(deltas) and final.status == "completed"
    assert kinds[:4] == OPENING and kinds[-4:] == [*CLOSING, "response.completed"]


def test_the_event_sequence_validates_against_openais_schema(http: httpx.Client) -> None:
    events = stream_events(http, "/v1/responses", {"model": ECHO, "input": "hi", "stream": True})
    assert events[-1].data == "[DONE]"
    payloads = [json.loads(e.data) for e in events[:-1]]
    for event, payload in zip(events, payloads, strict=False):
        assert event.name == payload["type"]
        validate(payload, EVENT_SCHEMAS[payload["type"]])
        validate(payload, "ResponseStreamEvent")
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    kinds = [p["type"] for p in payloads]
    assert kinds[:4] == OPENING and kinds[-4:] == [*CLOSING, "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    text = "".join(p["delta"] for p in payloads if p["type"] == "response.output_text.delta")
    completed = payloads[-1]["response"]
    assert completed["output"][0]["content"][0]["text"] == text == payloads[-4]["text"]
    assert payloads[0]["response"]["status"] == "in_progress" and completed["usage"]["output_tokens"] > 0


def test_instructions_max_output_tokens_and_an_incomplete_response(http: httpx.Client) -> None:
    body = {"model": ECHO, "input": "hi", "instructions": "Be brief.", "max_output_tokens": 3}
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    validate(result, "Response")
    assert result["status"] == "incomplete" and result["incomplete_details"] == {"reason": "max_output_tokens"}
    assert result["usage"]["output_tokens"] == 3 and result["instructions"] == "Be brief."
    # ft-echo repeats the prompt, which starts with the instructions as the system message.
    text = result["output"][0]["content"][0]["text"]
    assert text and "system\nBe brief.".startswith(text)


def test_a_stored_response_continues_with_previous_response_id(client: openai.OpenAI, http: httpx.Client) -> None:
    first = client.responses.create(model=ECHO, input="one two three", max_output_tokens=8)
    assert http.get(f"/v1/responses/{first.id}").json()["output"][0]["id"] == first.output[0].id
    second = client.responses.create(model=ECHO, input="four", previous_response_id=first.id, max_output_tokens=8)
    assert first.usage is not None and second.usage is not None
    # The second prompt holds the first exchange: its input and its output, and the new input.
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.previous_response_id == first.id
    unstored = client.responses.create(model=ECHO, input="hi", store=False, max_output_tokens=2)
    assert http.get(f"/v1/responses/{unstored.id}").status_code == 404


def test_text_format_goes_the_way_of_chats_response_format(client: openai.OpenAI, http: httpx.Client) -> None:
    plain = client.responses.create(model=ECHO, input="hi", text={"format": {"type": "text"}}, max_output_tokens=4)
    assert plain.text is not None and plain.text.format is not None and plain.text.format.type == "text"
    # Whatever chat's response_format does with a JSON schema, the Responses request gets the same, under
    # its own parameter name.
    json_schema = {"format": {"type": "json_schema", "name": "city", "schema": {"type": "object"}}}
    chat = http.post("/v1/chat/completions", json={"model": ECHO, "messages": [{"role": "user", "content": "hi"}],
                                                   "response_format": {"type": "json_schema", "json_schema": {
                                                       "name": "city", "schema": {"type": "object"}}}})
    response = http.post("/v1/responses", json={"model": ECHO, "input": "hi", "text": json_schema})
    assert response.status_code == chat.status_code
    if chat.status_code == 400:
        assert response.json()["error"]["param"] == "text.format"


def test_function_tools_go_the_way_of_chats_tools(http: httpx.Client) -> None:
    tool = {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
    chat = http.post("/v1/chat/completions", json={"model": ECHO, "messages": [{"role": "user", "content": "hi"}],
                                                   "tools": [{"type": "function", "function": tool}]})
    response = http.post("/v1/responses", json={"model": ECHO, "input": "hi", "tools": [{"type": "function", **tool}]})
    assert response.status_code == chat.status_code
    if chat.status_code == 400:
        assert response.json()["error"]["param"] == "tools"


QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {"type": "function_call", "call_id": "call_42", "name": "get_weather", "arguments": '{"city": "Paris"}'}
RESULT = {"type": "function_call_output", "call_id": "call_42", "output": "sunny and 21 degrees"}


AS_CHAT = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [
    {"id": "call_42", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "call_42", "content": "sunny and 21 degrees"}]


def prompt_tokens(http: httpx.Client, path: str, body: dict[str, Any]) -> int:
    limit = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
    response = http.post(path, json={"model": ECHO, limit: 1, **body})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    return int(usage.get("input_tokens", usage.get("prompt_tokens")))


def test_an_agents_second_turn_reads_as_chats_tool_messages(http: httpx.Client) -> None:
    """A call and its output are the prompt of chat's assistant tool_calls and tool messages (the same
    tokens), and a stored response keeps them for the next turn."""
    first = http.post("/v1/responses", json={"model": ECHO, "input": [QUESTION, CALL, RESULT], "max_output_tokens": 4})
    assert first.status_code == 200, first.text
    validate(first.json(), "Response")
    tokens = first.json()["usage"]["input_tokens"]
    assert tokens == prompt_tokens(http, "/v1/chat/completions", {"messages": AS_CHAT})
    assert tokens > prompt_tokens(http, "/v1/chat/completions", {"messages": AS_CHAT[:2]})  # the output counts
    # The output as text parts, and calls after the answer's text (one assistant message), read the same way.
    parts = {**RESULT, "output": [{"type": "input_text", "text": "sunny and 21 degrees"}]}
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]}
    with_text = [AS_CHAT[0], {**AS_CHAT[1], "content": "Let me look."}, AS_CHAT[2]]
    assert prompt_tokens(http, "/v1/responses", {"input": [QUESTION, said, CALL, parts]}) == \
        prompt_tokens(http, "/v1/chat/completions", {"messages": with_text})
    answer = first.json()["output"][0]["content"][0]["text"]
    later = prompt_tokens(http, "/v1/responses", {"input": "Thanks.", "previous_response_id": first.json()["id"]})
    assert later == prompt_tokens(http, "/v1/chat/completions", {"messages": [
        *AS_CHAT, {"role": "assistant", "content": answer}, {"role": "user", "content": "Thanks."}]})


BAD = [
    ("empty input", {"input": ""}, 400, "input"),
    ("empty input list", {"input": []}, 400, "input"),
    ("unsupported item type", {"input": [{"role": "user", "content": "hi"},
                                         {"type": "item_reference", "id": "msg_1"}]}, 400,
     "input[1].type"),
    ("image for a model without image input", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "x"}]}]}, 400, "input[0].content[0].image_url"),
    ("unknown role", {"input": [{"role": "robot", "content": "hi"}]}, 400, "input[0].role"),
    ("call without call_id", {"input": [QUESTION, {**CALL, "call_id": None}]}, 400, "input[1].call_id"),
    ("call arguments not a string", {"input": [QUESTION, {**CALL, "arguments": {"city": "Paris"}}]}, 400,
     "input[1].arguments"),
    ("output not text", {"input": [QUESTION, {**RESULT, "output": 42}]}, 400, "input[1].output"),
    ("bad message content", {"input": [QUESTION, QUESTION, QUESTION, {"role": "user", "content": 7}]}, 400,
     "input[3].content"),
    ("tool choice names no tool", {"input": "hi", "tool_choice": {"type": "function", "name": "nope"}}, 400,
     "tool_choice"),
    ("tool without a name", {"input": "hi", "tools": [{"type": "function"}]}, 400, "tools"),
    ("json schema without schema", {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, 400,
     "text.format"),
    ("unknown previous response", {"input": "hi", "previous_response_id": "resp-nope"}, 400,
     "previous_response_id"),
    ("tool choice names a built-in tool", {"input": "hi", "tools": [{"type": "web_search"}],
                                          "tool_choice": {"type": "web_search_preview"}}, 400, "tool_choice"),
    ("bad text format", {"input": "hi", "text": {"format": {"type": "xml"}}}, 400, "text.format"),
    ("temperature", {"input": "hi", "temperature": 3}, 400, "temperature"),
    ("unknown model", {"model": "no-such-model", "input": "hi"}, 404, "model"),
]


@pytest.mark.parametrize(("case", "body", "status", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_input(http: httpx.Client, case: str, body: dict[str, Any], status: int, param: str) -> None:
    response = http.post("/v1/responses", json={"model": ECHO, **body})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    validate(response.json(), "ErrorResponse")
    if status == 400:
        assert error["param"] == param, error
    named = {"unsupported item type": "'item_reference'", "unknown role": "'robot'",
             "image for a model without image input": "does not take images"}
    assert named.get(case, "") in error["message"]


def test_an_unknown_response_id_is_a_404(http: httpx.Client) -> None:
    response = http.get("/v1/responses/resp-unknown")
    assert response.status_code == 404 and response.json()["error"]["code"] == "response_not_found"
