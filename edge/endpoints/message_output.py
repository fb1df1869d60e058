"""A Messages answer: collected into one Message (`MessageShape.response`) or streamed as Anthropic's events
(`MessageEvents`): `message_start`, `ping`, per content block `content_block_start`, its deltas
(`thinking_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta` (the
stop reason, the usage and the context edits applied) and `message_stop`; and a token count's answer.

The usage counts as Anthropic's does: `input_tokens` are the prompt tokens the backend did not take from its
cache, `cache_read_input_tokens` those it did (`Usage.cached_tokens`; known when the generation ends, so 0 in
`message_start`), `cache_creation_input_tokens` 0.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterable, Iterator
from typing import Any

import orjson

from edge.endpoints.llm_common import Collected
from edge.sse import EventStream, sse_response
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop(finish_reason: str, stop_string: str) -> dict[str, Any]:
    if stop_string:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop_string}
    return {"stop_reason": STOP_REASONS.get(finish_reason, "end_turn"), "stop_sequence": None}


def _usage(usage: common_pb2.Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": usage.cached_tokens}


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (a model that wrote no JSON object gives {})."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}  # no signature: nothing here is signed


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, call_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": call_input}


class MessageShape:
    """A whole Message (the collecting side of the generation path), and its stream (`events`): the thinking's
    text shown unless `thinking_shown` is False (its blocks empty), the context edits applied
    (`applied_edits`) reported unless None (the request asked for none)."""

    object = "message"
    prefix = "msg_"  # Anthropic's ids: msg_...

    def __init__(self, thinking_shown: bool = True, applied_edits: list[dict[str, Any]] | None = None) -> None:
        self.thinking_shown = thinking_shown
        self.context_management = None if applied_edits is None else {"applied_edits": applied_edits}

    def message(self, head: dict[str, Any], content: list[dict[str, Any]], stop: dict[str, Any],
                usage: dict[str, int]) -> dict[str, Any]:
        return {"id": head["id"], "type": "message", "role": "assistant", "model": head["model"], "content": content,
                **stop, "usage": usage}

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        choice = choices[0]
        content = [thinking_block(choice.reasoning if self.thinking_shown else "")] if choice.reasoning else []
        if choice.text:
            content.append(text_block(choice.text))
        content += [tool_use_block(call["id"], call["name"], _arguments(call["arguments"]))
                    for call in choice.tool_calls]
        message = self.message(head, content, _stop(choice.finish_reason, choice.stop_string), _usage(usage))
        if self.context_management is not None:
            message["context_management"] = self.context_management
        return message

    def events(self, head: dict[str, Any]) -> MessageEvents:
        return MessageEvents(self, head)


class MessageEvents:
    """Anthropic's stream: message_start and a ping; each content block opened (content_block_start) with
    the first piece of its kind (thinking, text, or a new tool call), its deltas, closed
    (content_block_stop) when another begins or the answer ends; then message_delta and message_stop."""

    def __init__(self, shape: MessageShape, head: dict[str, Any]) -> None:
        self.shape = shape
        self.head = head
        self.blocks = 0  # blocks opened so far; the last is open while `open` is set
        self.open: str | None = None  # "thinking", "text", or the index of the tool call being streamed
        self.stop: dict[str, Any] = _stop("stop", "")
        self.input_tokens = 0

    def _close(self) -> Iterator[bytes]:
        if self.open is not None:
            yield _event({"type": "content_block_stop", "index": self.blocks - 1})
            self.open = None

    def _block(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        """Open a block of `kind` unless one is open."""
        if self.open != kind:
            yield from self._close()
            yield _event({"type": "content_block_start", "index": self.blocks, "content_block": block})
            self.blocks += 1
            self.open = kind

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        self.input_tokens = accepted.prompt_tokens
        message = self.shape.message(self.head, [], {"stop_reason": None, "stop_sequence": None},
                                     _usage(common_pb2.Usage(prompt_tokens=accepted.prompt_tokens)))
        yield _event({"type": "message_start", "message": message})
        yield _event({"type": "ping"})

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if delta.reasoning:
            yield from self._block("thinking", thinking_block(""))
            if self.shape.thinking_shown:
                yield self._delta({"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.text:
            yield from self._block("text", text_block(""))
            yield self._delta({"type": "text_delta", "text": delta.text})
        for piece in delta.tool_calls:
            yield from self._block(f"call {piece.index}", tool_use_block(piece.id, piece.name, {}))
            if piece.arguments:
                yield self._delta({"type": "input_json_delta", "partial_json": piece.arguments})

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.stop = _stop(finish_reason, stop_string)
        yield from self._close()

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        closing = {"type": "message_delta", "delta": self.stop, "usage": _usage(usage)}
        if self.shape.context_management is not None:
            closing["context_management"] = self.shape.context_management
        yield _event(closing)
        yield _event({"type": "message_stop"})


def event_stream(events: AsyncGenerator[bytes, None], keepalive_s: float) -> EventStream:
    """The stream's events as Server-Sent Events: Anthropic's streams end without `[DONE]`."""
    return sse_response(events, keepalive_s, done=b"")


def token_count(tokens: int) -> dict[str, int]:
    return {"input_tokens": tokens}
