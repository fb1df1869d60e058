"""POST /v1/messages and /v1/messages/count_tokens on the whole stack, through the real anthropic SDK: text,
stop sequences, streams (every event against Anthropic's published shapes, tests/support/anthropic_schema.py),
a tool round trip, forced tool calls enforced by guided decoding, token counts, and bad input refused in
Anthropic's error shape with its typed errors.

`ft-echo-hermes` renders only the last message and repeats it (tests/templates/echo-tools.jinja), so the
message text scripts the model's answer, tool calls included."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from launcher.stack import DEMO_LLMS, LocalStack
from tests.support.anthropic_schema import validate_count, validate_error, validate_event, validate_message
from tests.support.streams import stream_events

ECHO = "ft-echo-hermes"
GUIDED = DEMO_LLMS["tensorrt_llm"]
SMOLLM2 = DEMO_LLMS["fastertransformer"]
PARAMS = {"type": "object", "additionalProperties": False, "required": ["zone"],
          "properties": {"zone": {"type": "string", "enum": ["Europe/Rome", "Asia/Tokyo"]}}}
TOOL: Any = {"name": "get_time", "description": "The current time in a time zone.", "input_schema": PARAMS}
ARGS = {"zone": "Europe/Rome"}
CALL = "Checking.\n<tool_call>\n" + json.dumps({"name": "get_time", "arguments": ARGS}) + "\n</tool_call>"


@pytest.fixture(scope="module")
def claude(stack: LocalStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.edge_url, api_key="unused", max_retries=0, timeout=300)


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def test_create_answers_with_a_text_block_and_usage(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    message = claude.messages.create(model=ECHO, max_tokens=64, messages=user("Hello there, Claude."))
    assert message.type == "message" and message.role == "assistant" and message.model == ECHO
    assert message.id.startswith("msg_")  # Anthropic's ids
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [("text", "Hello there, Claude.")]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    raw = http.post("/v1/messages", json={"model": ECHO, "max_tokens": 64, "messages": user("Hi."),
                                          "system": "Be brief.", "metadata": {"user_id": "u1"}},
                    headers={"anthropic-version": "2023-06-01"})
    assert raw.status_code == 200, raw.text
    validate_message(raw.json())


def test_stop_sequences_and_max_tokens_give_their_stop_reasons(claude: anthropic.Anthropic) -> None:
    stopped = claude.messages.create(model=ECHO, max_tokens=64, messages=user("one two END three"),
                                     stop_sequences=["NEVER", "END"])
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == "END"
    assert stopped.content[0].type == "text" and stopped.content[0].text == "one two "
    cut = claude.messages.create(model=ECHO, max_tokens=2, messages=user("one two three four five six"))
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2


def test_a_stream_is_anthropics_event_sequence(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    events = stream_events(http, "/v1/messages", {"model": ECHO, "max_tokens": 64, "stream": True,
                                                  "messages": user("Streaming, token by token.")})
    payloads = [json.loads(event.data) for event in events]
    for event, payload in zip(events, payloads, strict=True):
        assert event.name == payload["type"]
        validate_event(payload)
    kinds = [payload["type"] for payload in payloads]
    deltas = kinds.count("content_block_delta")
    assert kinds == ["message_start", "ping", "content_block_start", *["content_block_delta"] * deltas,
                     "content_block_stop", "message_delta", "message_stop"] and deltas > 2
    assert "".join(p["delta"]["text"] for p in payloads if p["type"] == "content_block_delta") == \
        "Streaming, token by token."
    assert payloads[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert payloads[0]["message"]["usage"]["input_tokens"] == payloads[-2]["usage"]["input_tokens"] > 0

    with claude.messages.stream(model=ECHO, max_tokens=64, messages=user("Streaming, token by token.")) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Streaming, token by token." and final.stop_reason == "end_turn"


def test_a_tool_round_trip_created_and_streamed(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(model=ECHO, max_tokens=128, messages=user(CALL), tools=[TOOL])
    assert first.stop_reason == "tool_use"
    text, call = first.content
    assert text.type == "text" and text.text == "Checking.\n"
    assert call.type == "tool_use" and call.name == "get_time" and call.input == ARGS and call.id
    with claude.messages.stream(model=ECHO, max_tokens=128, messages=user(CALL), tools=[TOOL]) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "tool_use" and [b.type for b in streamed.content] == ["text", "tool_use"]
    assert streamed.content[1].type == "tool_use" and streamed.content[1].input == ARGS

    answer = claude.messages.create(model=ECHO, max_tokens=64, tools=[TOOL], messages=[
        *user(CALL), {"role": "assistant", "content": first.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "It is 13:00."}]}])
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"
    assert answer.content[0].text == "It is 13:00."


@pytest.mark.parametrize("choice", [{"type": "tool", "name": "get_time"}, {"type": "any"}])
def test_forced_tool_choice_is_enforced_by_guided_decoding(claude: anthropic.Anthropic, choice: Any) -> None:
    # This SDK release no longer has `temperature` (the API still takes it): sent as an extra field.
    message = claude.messages.create(model=GUIDED, max_tokens=48, extra_body={"temperature": 0}, tools=[TOOL],
                                     tool_choice=choice,
                                     messages=user("What time is it in Tokyo?"))
    calls = [block for block in message.content if block.type == "tool_use"]
    assert message.stop_reason == "tool_use" and calls and calls[0].name == "get_time"
    jsonschema.validate(calls[0].input, PARAMS)


def test_count_tokens_counts_what_create_sends(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    question = user("What is the capital of France?")
    counted = claude.messages.count_tokens(model=SMOLLM2, messages=question, system="Be brief.")
    created = claude.messages.create(model=SMOLLM2, max_tokens=1, messages=question, system="Be brief.")
    assert counted.input_tokens == created.usage.input_tokens > 5
    with_tools = claude.messages.count_tokens(model=SMOLLM2, messages=question, system="Be brief.", tools=[TOOL])
    assert with_tools.input_tokens > counted.input_tokens  # the tools are described to the model
    raw = http.post("/v1/messages/count_tokens", json={"model": SMOLLM2, "messages": question})
    assert raw.status_code == 200, raw.text
    validate_count(raw.json())


GOOD: dict[str, Any] = {"model": ECHO, "max_tokens": 16, "messages": user("hi")}
BAD = [
    ("max_tokens missing", {"model": ECHO, "messages": user("hi")}, "max_tokens"),
    ("empty messages", {**GOOD, "messages": []}, "messages"),
    ("tool_result without its tool_use", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "toolu_x", "content": "13:00"}]}]}, "toolu_x"),
    ("unknown block type", {**GOOD, "messages": [{"role": "user", "content": [{"type": "hologram"}]}]}, "hologram"),
    ("tool_choice naming no tool", {**GOOD, "tools": [TOOL], "tool_choice": {"type": "tool", "name": "get_date"}},
     "get_date"),
]


@pytest.mark.parametrize(("body", "words"), [case[1:] for case in BAD], ids=[case[0] for case in BAD])
def test_bad_input_is_refused_in_anthropics_shape(http: httpx.Client, body: dict[str, Any], words: str) -> None:
    response = http.post("/v1/messages", json=body)
    assert response.status_code == 400, response.text
    validate_error(response.json())
    assert response.json()["error"]["type"] == "invalid_request_error" and words in response.json()["error"]["message"]


def test_two_consecutive_user_turns_are_fine(claude: anthropic.Anthropic) -> None:
    message = claude.messages.create(model=ECHO, max_tokens=64, messages=[*user("First."), *user("Second.")])
    assert message.content[0].type == "text" and message.content[0].text == "First.\nSecond."


def test_the_sdk_raises_its_typed_errors(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    with pytest.raises(anthropic.BadRequestError) as bad:
        claude.messages.create(model=ECHO, max_tokens=16, messages=[])
    assert bad.value.status_code == 400 and bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as missing:
        claude.messages.create(model="no-such-model", max_tokens=16, messages=user("hi"))
    validate_error(missing.value.body)
    assert missing.value.body["error"]["type"] == "not_found_error"
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.count_tokens(model=ECHO, messages=[])
    with pytest.raises(anthropic.APIStatusError) as failed, \
            claude.messages.stream(model="ft-echo-failing", max_tokens=64, messages=user("one two three four")) as s:
        "".join(s.text_stream)
    validate_error(failed.value.body)
    assert failed.value.body["error"]["type"] == "api_error"
    events = stream_events(http, "/v1/messages", {"model": "ft-echo-failing", "max_tokens": 64, "stream": True,
                                                  "messages": user("one two three four")})
    assert events[-1].name == "error" and all(event.data != "[DONE]" for event in events)
