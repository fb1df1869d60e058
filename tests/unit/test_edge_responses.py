"""The Responses API's output items and stream events for an answer with text and tool calls (which the
demo models, forced to call or not, never mix), its input items as chat messages, and the stored
conversation."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edge.endpoints.llm_common import Collected
from edge.endpoints.response_input import input_messages
from edge.endpoints.response_output import ResponseRecorder
from edge.endpoints.responses import ResponseRequest, Stored, history, stored
from edge.errors import OpenAIError, ParamError
from edge.state import Limits, Space
from edge.state.memory import MemoryStore
from tests.support.openai_schema import validate
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

HEAD = {"id": "resp-1", "created": 1, "model": "m"}
USAGE = common_pb2.Usage(prompt_tokens=5, completion_tokens=9, total_tokens=14)
DELTAS = [
    llm_pb2.Delta(text="Let me "), llm_pb2.Delta(text="look."),
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=0, id="call_a", name="weather", arguments='{"city":')]),
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=0, arguments=' "Paris"}'),
                              llm_pb2.ToolCallDelta(index=1, id="call_b", name="time", arguments="{}")]),
    llm_pb2.Delta(finish_reason="tool_calls"),
]


def recorder() -> tuple[ResponseRecorder, Space]:
    store = MemoryStore().space("responses", Limits(10, 60))
    return ResponseRecorder(ResponseRequest.model_validate(
        {"model": "m", "input": "weather?", "tools": [{"type": "function", "name": "weather"}]}), [], store), store


async def test_a_whole_answer_is_the_message_then_each_call_and_is_stored() -> None:
    choice = Collected()
    for delta in DELTAS:
        choice.add(delta)
    record, store = recorder()
    response = record.response(HEAD, [choice], USAGE)
    validate(response, "Response")
    assert [item["type"] for item in response["output"]] == ["message", "function_call", "function_call"]
    calls = response["output"][1:]
    assert [(c["call_id"], c["name"], c["arguments"]) for c in calls] == [
        ("call_a", "weather", '{"city": "Paris"}'), ("call_b", "time", "{}")]
    assert all(c["id"].startswith("fc_") and c["status"] == "completed" for c in calls)
    assert await store.get("resp-1") is None  # stored once persisted, before the client sees it
    await record.persist()
    value = await store.get("resp-1")
    assert value is not None and Stored.decoded(value).response == response
    conversation = Stored.decoded(value).conversation
    assert conversation is not None and as_json(conversation[-1]) == {
        "role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}}]}


def stream(deltas: list[llm_pb2.Delta]) -> list[dict[str, Any]]:
    record, _ = recorder()
    events = record.events(HEAD)
    chunks = [*events.start(llm_pb2.Accepted(choices=1))]
    for delta in deltas:
        if delta.text or delta.tool_calls:
            chunks.extend(events.delta(delta))
        if delta.finish_reason:
            chunks.extend(events.end(0, delta.finish_reason))
    chunks.extend(events.finish(USAGE))
    payloads = [json.loads(chunk.decode().split("data: ", 1)[1]) for chunk in chunks]
    for payload in payloads:
        validate(payload, "ResponseStreamEvent")
    assert [p["sequence_number"] for p in payloads] == list(range(len(payloads)))
    return payloads


def test_a_streamed_answer_opens_and_closes_each_item_in_turn() -> None:
    payloads = stream(DELTAS)
    assert [(p["type"], p.get("output_index")) for p in payloads] == [
        ("response.created", None), ("response.in_progress", None),
        ("response.output_item.added", 0), ("response.content_part.added", 0),
        ("response.output_text.delta", 0), ("response.output_text.delta", 0),
        ("response.output_text.done", 0), ("response.content_part.done", 0), ("response.output_item.done", 0),
        ("response.output_item.added", 1), ("response.function_call_arguments.delta", 1),
        ("response.function_call_arguments.delta", 1), ("response.function_call_arguments.done", 1),
        ("response.output_item.done", 1),
        ("response.output_item.added", 2), ("response.function_call_arguments.delta", 2),
        ("response.function_call_arguments.done", 2), ("response.output_item.done", 2),
        ("response.completed", None)]
    done = [p["item"] for p in payloads if p["type"] == "response.output_item.done"]
    assert payloads[-1]["response"]["output"] == done
    assert done[1]["arguments"] == '{"city": "Paris"}' and done[2]["call_id"] == "call_b"
    assert len({p["item_id"] for p in payloads if p.get("output_index") == 1 and "item_id" in p}) == 1


def test_an_empty_answer_is_one_empty_message() -> None:
    payloads = stream([llm_pb2.Delta(finish_reason="length")])
    assert payloads[-1]["type"] == "response.incomplete"
    assert payloads[-1]["response"]["output"][0]["content"][0]["text"] == ""
    assert payloads[-1]["response"]["output"][0]["status"] == "incomplete"


CALL = {"type": "function_call", "call_id": "call_a", "name": "weather", "arguments": "{}"}
TOOL_CALL = {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{}"}}


def test_calls_and_their_outputs_become_chats_tool_messages() -> None:
    output = {"type": "function_call_output", "call_id": "call_a", "output": [{"type": "input_text", "text": "sun"}]}
    assert as_chat([{"role": "user", "content": "hi"}, CALL, {**CALL, "call_id": "call_b"}, output]) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL, {**TOOL_CALL, "id": "call_b"}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "sun"}]
    said = {"type": "message", "role": "assistant", "content": "Let me look."}
    assert as_chat([said, CALL]) == [{"role": "assistant", "content": "Let me look.", "tool_calls": [TOOL_CALL]}]


def as_json(message: llm_pb2.ChatMessage) -> dict[str, Any]:
    """A chat message in OpenAI's JSON, as the assertions here read it."""
    if not message.tool_calls:
        return {"role": message.role, "content": message.content,
                **({"tool_call_id": message.tool_call_id} if message.tool_call_id else {})}
    calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
             for call in message.tool_calls]
    return {"role": message.role, "content": message.content or None, "tool_calls": calls}


def as_chat(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The input items as the chat messages a stored conversation keeps, which read back the same."""
    messages = input_messages(items).messages
    assert Stored.decoded(Stored({"id": "resp-1"}, messages).encoded()).conversation == messages
    return [as_json(message) for message in messages]


async def test_a_response_stored_by_the_previous_version_is_served_but_continues_nothing() -> None:
    """The previous version kept the conversation in JSON: its Response is still served, and a follow-up
    finds it expired (a 400, as for any response no longer stored), not a 500."""
    store = MemoryStore().space("responses", Limits(10, 60))
    response = {"id": "resp-old", "object": "response", "output": []}
    await store.put("resp-old", json.dumps({"response": response, "conversation": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}).encode())
    found = await stored(store, "resp-old")
    assert found is not None and found.response == response
    follow_up = ResponseRequest.model_validate({"model": "m", "input": "again", "previous_response_id": "resp-old"})
    with pytest.raises(OpenAIError) as error:
        await history(follow_up, store)
    assert (error.value.status, error.value.code) == (400, "previous_response_not_found")


@pytest.mark.parametrize(("item", "param"), [
    ({**CALL, "call_id": ""}, "input[1].call_id"), ({**CALL, "name": None}, "input[1].name"),
    ({**CALL, "arguments": {}}, "input[1].arguments"),
    ({"type": "function_call_output", "output": "x"}, "input[1].call_id"),
    ({"type": "function_call_output", "call_id": "c", "output": 42}, "input[1].output"),
    ({"type": "item_reference", "id": "msg_1"}, "input[1].type"), ("hi", "input[1]"),
    ({"role": "robot", "content": "x"}, "input[1].role"),
    ({"role": "assistant", "content": [{"type": "input_text", "text": "a"}, {"type": "input_image", "image_url": "x"}]},
     "input[1].content[1]"),
    ({"role": "user", "content": 3}, "input[1].content")])
def test_a_malformed_or_unsupported_item_is_refused_by_its_place(item: Any, param: str) -> None:
    with pytest.raises(ParamError) as error:
        input_messages([{"role": "user", "content": "hi"}, item])
    assert error.value.param == param and f"'{param}" in str(error.value)
