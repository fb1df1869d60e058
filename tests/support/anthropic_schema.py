"""Anthropic's Messages API shapes, written down from its API reference (Messages, Streaming Messages, Count
Message tokens, Errors) as JSON Schemas of what a response may hold, and checked again against the anthropic
SDK's own pydantic types (`anthropic.types.Message`, `RawMessageStreamEvent`, `MessageTokensCount`,
`ErrorResponse`, and the beta API's `BetaMessage`, `BetaRawMessageStreamEvent`, which know its
`context_management`). `validate_message`, `validate_event`, `validate_count`, `validate_error` raise on a
mismatch."""

from __future__ import annotations

from typing import Any

import jsonschema
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from anthropic.types.beta import BetaMessage, BetaRawMessageStreamEvent
from anthropic.types.shared import ErrorResponse
from pydantic import TypeAdapter

STOP_REASONS = ["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal"]
_INT = {"type": "integer", "minimum": 0}


def _object(required: dict[str, Any], optional: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": {**required, **(optional or {})}, "required": list(required),
            "additionalProperties": False}


USAGE = _object({"input_tokens": _INT, "output_tokens": _INT},
                {"cache_creation_input_tokens": {"type": ["integer", "null"]},
                 "cache_read_input_tokens": {"type": ["integer", "null"]}})
TEXT = _object({"type": {"const": "text"}, "text": {"type": "string"}})
THINKING = _object({"type": {"const": "thinking"}, "thinking": {"type": "string"}, "signature": {"type": "string"}})
TOOL_USE = _object({"type": {"const": "tool_use"}, "id": {"type": "string", "minLength": 1},
                    "name": {"type": "string", "minLength": 1}, "input": {"type": "object"}})
BLOCK = {"oneOf": [TEXT, THINKING, TOOL_USE]}
# The context edits a beta request asked for that cleared something (`context_management.applied_edits`).
CONTEXT_MANAGEMENT = _object({"applied_edits": {"type": "array", "items": {"oneOf": [
    _object({"type": {"const": "clear_thinking_20251015"}, "cleared_thinking_turns": _INT,
             "cleared_input_tokens": _INT}),
    _object({"type": {"const": "clear_tool_uses_20250919"}, "cleared_tool_uses": _INT,
             "cleared_input_tokens": _INT})]}}})
MESSAGE = _object({"id": {"type": "string"}, "type": {"const": "message"}, "role": {"const": "assistant"},
                   "model": {"type": "string"}, "content": {"type": "array", "items": BLOCK},
                   "stop_reason": {"enum": [*STOP_REASONS, None]}, "stop_sequence": {"type": ["string", "null"]},
                   "usage": USAGE}, {"context_management": CONTEXT_MANAGEMENT})
EVENTS: dict[str, dict[str, Any]] = {
    "message_start": _object({"type": {"const": "message_start"}, "message": MESSAGE}),
    "ping": _object({"type": {"const": "ping"}}),
    "content_block_start": _object({"type": {"const": "content_block_start"}, "index": _INT, "content_block": BLOCK}),
    "content_block_delta": _object({"type": {"const": "content_block_delta"}, "index": _INT, "delta": {"oneOf": [
        _object({"type": {"const": "text_delta"}, "text": {"type": "string"}}),
        _object({"type": {"const": "input_json_delta"}, "partial_json": {"type": "string"}}),
        _object({"type": {"const": "thinking_delta"}, "thinking": {"type": "string"}}),
        _object({"type": {"const": "signature_delta"}, "signature": {"type": "string"}})]}}),
    "content_block_stop": _object({"type": {"const": "content_block_stop"}, "index": _INT}),
    "message_delta": _object({"type": {"const": "message_delta"}, "usage": USAGE, "delta": _object(
        {"stop_reason": {"enum": STOP_REASONS}, "stop_sequence": {"type": ["string", "null"]}})},
        {"context_management": CONTEXT_MANAGEMENT}),
    "message_stop": _object({"type": {"const": "message_stop"}}),
}
ERROR_TYPES = ["invalid_request_error", "authentication_error", "billing_error", "permission_error",
               "not_found_error", "request_too_large", "rate_limit_error", "api_error", "timeout_error",
               "overloaded_error"]
ERROR = _object({"type": {"const": "error"}, "error": _object({"type": {"enum": ERROR_TYPES},
                                                               "message": {"type": "string"}})},
                {"request_id": {"type": ["string", "null"]}})
COUNT = _object({"input_tokens": _INT})

_SDK_EVENT: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
_SDK_BETA_EVENT: TypeAdapter[Any] = TypeAdapter(BetaRawMessageStreamEvent)


def validate_message(payload: Any) -> None:
    jsonschema.validate(payload, MESSAGE)
    Message.model_validate(payload)
    BetaMessage.model_validate(payload)


def validate_event(payload: Any) -> None:
    """One stream event (its `data`); ping is Anthropic's, though the SDK's union leaves it out."""
    kind = payload.get("type") if isinstance(payload, dict) else None
    if kind not in EVENTS:
        raise AssertionError(f"not one of Anthropic's stream events: {kind!r}")
    jsonschema.validate(payload, EVENTS[kind])
    if kind != "ping":
        _SDK_EVENT.validate_python(payload)
        _SDK_BETA_EVENT.validate_python(payload)


def validate_count(payload: Any) -> None:
    jsonschema.validate(payload, COUNT)
    MessageTokensCount.model_validate(payload)


def validate_error(payload: Any) -> None:
    jsonschema.validate(payload, ERROR)
    if payload["error"]["type"] != "request_too_large":  # the reference's 413, which the SDK's union lacks
        ErrorResponse.model_validate(payload)
