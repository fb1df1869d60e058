"""A Response: its output items (a `message` item for the text and a `function_call` item per tool call,
before them a `reasoning` item for a reasoning model's thinking, its text as a `reasoning_text` content
part), collected into a whole Response (`ResponseRecorder.response`) or streamed as the Responses API's
events (`ResponseEvents`: `response.created` ... `response.completed`), and stored when asked
(`ResponseRecorder.persist`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import orjson

from edge.endpoints.llm_common import Collected
from edge.endpoints.responses import ResponseRequest, Stored
from edge.state import Space
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2


def _echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as a Response lists it: `parameters` and `strict` always there (null when not given)."""
    return {"parameters": None, "strict": None, **tool}


def _usage(usage: common_pb2.Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total_tokens}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [_text_part(text)] if status != "in_progress" else []}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [],
            "content": [_reasoning_part(text)] if status != "in_progress" else []}


def call_item(item_id: str, call: dict[str, str], status: str) -> dict[str, Any]:
    """A `function_call` output item: `call_id` is the id chat gives the call."""
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call["id"], "name": call["name"],
            "arguments": call["arguments"]}


def output_items(choice: Collected, status: str) -> list[dict[str, Any]]:
    """A whole answer's output: the thinking, the message (left out when the answer is only calls or
    thinking, as OpenAI's), then the calls."""
    thinking = [reasoning_item(_item_id("rs"), choice.reasoning, status)] if choice.reasoning else []
    message = [message_item(_item_id("msg"), choice.text, status)] if choice.text or not (
        choice.tool_calls or thinking) else []
    return [*thinking, *message, *(call_item(_item_id("fc"), call, status) for call in choice.tool_calls)]


def assistant_message(output: list[dict[str, Any]]) -> llm_pb2.ChatMessage:
    """The output as the chat message that continues a stored conversation (a call without arguments
    has `{}`)."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [llm_pb2.ToolCall(id=item["call_id"], name=item["name"], arguments=item["arguments"] or "{}")
             for item in output if item["type"] == "function_call"]
    return llm_pb2.ChatMessage(role="assistant", content=text, tool_calls=calls)


class ResponseRecorder:
    """Builds the Response of one request (whole, or as stream events with `events`) and stores it
    (`persist`, before the client sees it finished)."""

    object = "response"
    prefix = "resp-"

    def __init__(self, body: ResponseRequest, history: Sequence[llm_pb2.ChatMessage], store: Space) -> None:
        self.body = body
        self.conversation = [*history, *body.messages]
        self.store = store
        self.finished_response: Stored | None = None  # to store, once finished

    def snapshot(self, head: dict[str, Any], status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        snapshot = {"id": head["id"], "object": "response", "created_at": head["created"], "status": status,
                "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
                "max_output_tokens": body.max_output_tokens, "model": head["model"], "output": output,
                "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": body.previous_response_id,
                "reasoning": body.reasoning.model_dump() if body.reasoning else None, "store": body.store is not False,
                "temperature": body.temperature, "top_p": body.top_p,
                "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
                "tool_choice": body.tool_choice or "auto", "tools": [_echoed_tool(tool) for tool in body.tools or []],
                "truncation": "disabled", "metadata": body.metadata or {}}
        if usage is not None:  # not while in progress
            snapshot["usage"] = usage
        if body.user is not None:
            snapshot["user"] = body.user
        return snapshot

    def finished(self, head: dict[str, Any], output: list[dict[str, Any]], finish_reason: str,
                 usage: common_pb2.Usage) -> dict[str, Any]:
        """The final Response; stored when asked."""
        status = _status(finish_reason)
        response = self.snapshot(head, status, output, _usage(usage))
        response["completed_at"] = int(time.time()) if status == "completed" else None
        if self.body.store is not False:
            self.finished_response = Stored(response, [*self.conversation, assistant_message(output)])
        return response

    async def persist(self) -> None:
        if self.finished_response is not None:
            await self.store.put(self.finished_response.response["id"], self.finished_response.encoded())

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        """The whole Response (the collecting side of the generation path)."""
        choice = choices[0]
        output = output_items(choice, _status(choice.finish_reason))
        return self.finished(head, output, choice.finish_reason, usage)

    def events(self, head: dict[str, Any]) -> ResponseEvents:
        return ResponseEvents(self, head)


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponseEvents:
    """The Responses stream: created and in_progress; then each output item in turn, opened (added), its
    text deltas (a message's or a reasoning item's) or arguments deltas (a function call's), closed (done);
    then completed (or
    incomplete) with the usage. A message item opens with the first text, a function_call item with the
    first piece of a call; an answer with neither is one empty message."""

    def __init__(self, recorder: ResponseRecorder, head: dict[str, Any]) -> None:
        self.recorder = recorder
        self.head = head
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items so far; the last is open while `current` is set
        self.current: dict[str, Any] | None = None
        self.call_index = -1  # the chat index of the call being streamed
        self.parts: list[str] = []  # the open message's text
        self.finish_reason = "stop"

    def _emit(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _event(payload)

    def _at(self) -> dict[str, Any]:
        """Where an event of the open item points."""
        assert self.current is not None
        return {"item_id": self.current["id"], "output_index": len(self.items) - 1}

    def _open(self, item: dict[str, Any]) -> Iterable[bytes]:
        self.current = item
        self.items.append(item)
        yield self._emit("response.output_item.added", output_index=len(self.items) - 1, item=item)
        if item["type"] in ("message", "reasoning"):
            self.parts = []
            part = _text_part("") if item["type"] == "message" else _reasoning_part("")
            yield self._emit("response.content_part.added", **self._at(), content_index=0, part=part)

    def _close(self, status: str) -> Iterable[bytes]:
        item = self.current
        if item is None:
            return
        if item["type"] == "message":
            text = "".join(self.parts)
            yield self._emit("response.output_text.done", **self._at(), content_index=0, text=text, logprobs=[])
            yield self._emit("response.content_part.done", **self._at(), content_index=0, part=_text_part(text))
            done = message_item(item["id"], text, status)
        elif item["type"] == "reasoning":
            text = "".join(self.parts)
            yield self._emit("response.reasoning_text.done", **self._at(), content_index=0, text=text)
            yield self._emit("response.content_part.done", **self._at(), content_index=0, part=_reasoning_part(text))
            done = reasoning_item(item["id"], text, status)
        else:
            yield self._emit("response.function_call_arguments.done", **self._at(), name=item["name"],
                             arguments=item["arguments"])
            done = {**item, "status": status}
        self.items[-1] = done
        self.current = None
        yield self._emit("response.output_item.done", output_index=len(self.items) - 1, item=done)

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        opening = self.recorder.snapshot(self.head, "in_progress", [], None)
        yield self._emit("response.created", response=opening)
        yield self._emit("response.in_progress", response=opening)

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if delta.reasoning:
            if self.current is None or self.current["type"] != "reasoning":
                yield from self._close("completed")
                yield from self._open(reasoning_item(_item_id("rs"), "", "in_progress"))
            self.parts.append(delta.reasoning)
            yield self._emit("response.reasoning_text.delta", **self._at(), content_index=0, delta=delta.reasoning)
        if delta.text:
            if self.current is None or self.current["type"] != "message":
                yield from self._close("completed")
                yield from self._open(message_item(_item_id("msg"), "", "in_progress"))
            self.parts.append(delta.text)
            yield self._emit("response.output_text.delta", **self._at(), content_index=0, delta=delta.text,
                             logprobs=[])
        for piece in delta.tool_calls:
            if self.current is None or self.current["type"] != "function_call" or piece.index != self.call_index:
                yield from self._close("completed")
                self.call_index = piece.index
                call = {"id": piece.id, "name": piece.name, "arguments": ""}
                yield from self._open(call_item(_item_id("fc"), call, "in_progress"))
            if piece.arguments:
                assert self.current is not None
                self.current = {**self.current, "arguments": self.current["arguments"] + piece.arguments}
                self.items[-1] = self.current
                yield self._emit("response.function_call_arguments.delta", **self._at(), delta=piece.arguments)

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.finish_reason = finish_reason
        if not self.items:
            yield from self._open(message_item(_item_id("msg"), "", "in_progress"))
        yield from self._close(_status(finish_reason))

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        response = self.recorder.finished(self.head, self.items, self.finish_reason, usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield self._emit(kind, response=response)
