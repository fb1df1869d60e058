"""A Response, collected into a whole Response (`ResponseRecorder.response`) or streamed as the Responses
API's events (`ResponseEvents`: `response.created` ... `response.completed`, `response.incomplete` or
`response.failed`), and stored when asked (`ResponseRecorder.persist`). Its output items are written by
edge/endpoints/response_items.py.
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any

import orjson

from edge.endpoints.llm_common import Collected
from edge.endpoints.response_items import (
    CALL_TEXT,
    assistant_message,
    call_item,
    item_id,
    message_item,
    output_items,
    reasoning_item,
    reasoning_part,
    status_of,
    text_part,
    usage_json,
)
from edge.endpoints.responses import ResponseRequest, Stored
from edge.errors import OpenAIError
from edge.sse import EventStream, sse_response
from edge.state import Space
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# OpenAI's codes of a failed Response (ResponseErrorCode) for the edge's errors.
FAILURE_CODES = {429: "rate_limit_exceeded"}


def _echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A tool as a Response lists it: a function tool's `parameters` and `strict` always there (null when
    not given)."""
    return {"parameters": None, "strict": None, **tool} if tool.get("type") == "function" else tool


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
        self.stream: ResponseEvents | None = None  # the events of a streamed Response

    def snapshot(self, head: dict[str, Any], status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        text = body.text
        snapshot = {"id": head["id"], "object": "response", "created_at": head["created"], "status": status,
                    "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
                    "max_output_tokens": body.max_output_tokens, "model": head["model"], "output": output,
                    "parallel_tool_calls": body.tooling.parallel is not False,
                    "previous_response_id": body.previous_response_id,
                    "reasoning": body.reasoning.model_dump() if body.reasoning else None,
                    "store": body.store is not False, "temperature": body.temperature, "top_p": body.top_p,
                    "text": {"format": (text.format if text else None) or {"type": "text"},
                             **({"verbosity": text.verbosity} if text and text.verbosity else {})},
                    "tool_choice": body.tool_choice or "auto", "tools": [_echoed_tool(t) for t in body.tools or []],
                    "truncation": body.truncation or "disabled", "metadata": body.metadata or {}}
        if usage is not None:  # not while in progress
            snapshot["usage"] = usage
        echoed = {"user": body.user, "max_tool_calls": body.max_tool_calls, "prompt_cache_key": body.prompt_cache_key,
                  "safety_identifier": body.safety_identifier, "service_tier": body.service_tier}
        snapshot.update((name, value) for name, value in echoed.items() if value is not None)
        return snapshot

    def finished(self, head: dict[str, Any], output: list[dict[str, Any]], finish_reason: str,
                 usage: common_pb2.Usage) -> dict[str, Any]:
        """The final Response; stored when asked."""
        status = status_of(finish_reason)
        response = self.snapshot(head, status, output, usage_json(usage))
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
        output = output_items(choice, status_of(choice.finish_reason), self.body.request_tools,
                              self.body.encrypted_reasoning)
        return self.finished(head, output, choice.finish_reason, usage)

    def events(self, head: dict[str, Any]) -> ResponseEvents:
        self.stream = ResponseEvents(self, head)
        return self.stream

    def event_stream(self, events: AsyncGenerator[bytes, None], keepalive_s: float) -> EventStream:
        """The stream's events as Server-Sent Events; a failure after they started is `response.failed`."""
        return sse_response(events, keepalive_s, failed=self.failed)

    def failed(self, error: OpenAIError, path: str) -> bytes:
        assert self.stream is not None  # the stream is written by its events
        return self.stream.failed(error)


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponseEvents:
    """The Responses stream: created and in_progress; then each output item in turn, opened (added), its
    text deltas (a message's or a reasoning item's), arguments deltas (a function call's) or input deltas
    (a custom tool call's), closed (done); then completed (or incomplete) with the usage, or failed. A
    message item opens with the first text, a call's item with the first piece of the call; an answer with
    neither is one empty message. Each item's id is the same in every event and in the final Response."""

    def __init__(self, recorder: ResponseRecorder, head: dict[str, Any]) -> None:
        self.recorder = recorder
        self.head = head
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items so far; the last is open while `current` is set
        self.current: dict[str, Any] | None = None
        self.call_index = -1  # the chat index of the call being streamed
        self.parts: list[str] = []  # the open message's or reasoning item's text
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
            part = text_part("") if item["type"] == "message" else reasoning_part("")
            yield self._emit("response.content_part.added", **self._at(), content_index=0, part=part)

    def _close(self, status: str) -> Iterable[bytes]:
        item = self.current
        if item is None:
            return
        if item["type"] == "message":
            text = "".join(self.parts)
            yield self._emit("response.output_text.done", **self._at(), content_index=0, text=text, logprobs=[])
            yield self._emit("response.content_part.done", **self._at(), content_index=0, part=text_part(text))
            done = message_item(item["id"], text, status)
        elif item["type"] == "reasoning":
            text = "".join(self.parts)
            yield self._emit("response.reasoning_text.done", **self._at(), content_index=0, text=text)
            yield self._emit("response.content_part.done", **self._at(), content_index=0, part=reasoning_part(text))
            done = reasoning_item(item["id"], text, status, self.recorder.body.encrypted_reasoning)
        elif item["type"] == "custom_tool_call":
            yield self._emit("response.custom_tool_call_input.done", **self._at(), input=item["input"])
            done = item
        else:
            yield self._emit("response.function_call_arguments.done", **self._at(), name=item["name"],
                             arguments=item["arguments"])
            done = {**item, "status": status}
        self.items[-1] = done
        self.current = None
        yield self._emit("response.output_item.done", output_index=len(self.items) - 1, item=done)

    def _text(self, kind: str, text: str) -> Iterable[bytes]:
        """More of a message's text or a reasoning item's, opening the item first when another is open."""
        if self.current is None or self.current["type"] != kind:
            yield from self._close("completed")
            opened = message_item(item_id("msg"), "", "in_progress") if kind == "message" else \
                reasoning_item(item_id("rs"), "", "in_progress")
            yield from self._open(opened)
        self.parts.append(text)
        if kind == "message":
            yield self._emit("response.output_text.delta", **self._at(), content_index=0, delta=text, logprobs=[])
        else:
            yield self._emit("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)

    def _call(self, piece: llm_pb2.ToolCallDelta) -> Iterable[bytes]:
        """A piece of a call: its item opened with its first piece, then more of its text."""
        if self.current is None or self.current["type"] not in CALL_TEXT or piece.index != self.call_index:
            yield from self._close("completed")
            self.call_index = piece.index
            call = {"id": piece.id, "name": piece.name, "arguments": ""}
            yield from self._open(call_item(call, "in_progress", self.recorder.body.request_tools.called(piece.name)))
        if piece.arguments:
            assert self.current is not None
            field = CALL_TEXT[self.current["type"]]
            self.current = {**self.current, field: self.current[field] + piece.arguments}
            self.items[-1] = self.current
            kind = "response.function_call_arguments.delta" if field == "arguments" else \
                "response.custom_tool_call_input.delta"
            yield self._emit(kind, **self._at(), delta=piece.arguments)

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        opening = self.recorder.snapshot(self.head, "in_progress", [], None)
        yield self._emit("response.created", response=opening)
        yield self._emit("response.in_progress", response=opening)

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if delta.reasoning:
            yield from self._text("reasoning", delta.reasoning)
        if delta.text:
            yield from self._text("message", delta.text)
        for piece in delta.tool_calls:
            yield from self._call(piece)

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.finish_reason = finish_reason
        if not self.items:
            yield from self._open(message_item(item_id("msg"), "", "in_progress"))
        yield from self._close(status_of(finish_reason))

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        response = self.recorder.finished(self.head, self.items, self.finish_reason, usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield self._emit(kind, response=response)

    def failed(self, error: OpenAIError) -> bytes:
        """`response.failed`: the Response as far as it went, with status `failed` and the error (not stored)."""
        response = self.recorder.snapshot(self.head, "failed", self.items, None)
        response["error"] = {"code": FAILURE_CODES.get(error.status, "server_error"), "message": error.message}
        return self._emit("response.failed", response=response)
