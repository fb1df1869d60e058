"""A Responses request's `input` as chat messages: message items, and the function calls of an earlier
answer (`function_call` items) with their results (`function_call_output` items), which become chat's
assistant `tool_calls` and `tool` messages, so that an agent's next turn reads as chat's would."""

from __future__ import annotations

from typing import Any

from edge.endpoints.common import ParamError

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
ITEM_TYPES = ("message", "function_call", "function_call_output")

Message = dict[str, Any]  # one chat message: role, content, and tool_calls or tool_call_id


def _item_text(content: Any, where: str, field: str = "content") -> str:
    """A message item's content (or a call output): a string, or text parts (joined with newlines)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"'{where}.{field}' must be a string or an array of content parts", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise ParamError(f"'{where}.{field}[{j}]': content parts of type {kind!r} are not supported: only "
                             "input_text and output_text", "input")
    return "\n".join(texts)


def _string(item: dict[str, Any], field: str, where: str) -> str:
    value = item.get(field)
    if not isinstance(value, str) or not value:
        raise ParamError(f"'{where}.{field}' must be a non-empty string", "input")
    return value


def _call(item: dict[str, Any], where: str) -> dict[str, Any]:
    """A `function_call` item as an entry of chat's `tool_calls`."""
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise ParamError(f"'{where}.arguments' must be a string (the call's arguments as JSON)", "input")
    return {"id": _string(item, "call_id", where), "type": "function",
            "function": {"name": _string(item, "name", where), "arguments": arguments}}


def _message(item: dict[str, Any], where: str) -> Message:
    role = item.get("role")
    if role not in ROLES:
        raise ParamError(f"'{where}.role' must be one of {', '.join(ROLES)}; got {role!r}", "input")
    return {"role": role, "content": _item_text(item.get("content"), where)}


def _add_call(messages: list[Message], call: dict[str, Any]) -> None:
    """Calls that follow an assistant message (its text, or calls made with it) belong to that message,
    as one chat answer holds its text and all its calls."""
    last = messages[-1] if messages else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
    else:
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})


def input_messages(value: Any) -> list[Message]:
    """`input`: a string (one user message) or input items; any other item type is refused by name."""
    if isinstance(value, str):
        if not value:
            raise ParamError("'input' must not be empty", "input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ParamError("'input' must be a non-empty string or a non-empty array of input items", "input")
    messages: list[Message] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ParamError(f"'{where}' must be an object (an input item)", "input")
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            _add_call(messages, _call(item, where))
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _string(item, "call_id", where),
                             "content": _item_text(item.get("output"), where, "output")})
        else:
            raise ParamError(f"'{where}': input items of type {kind!r} are not supported: only "
                             f"{', '.join(repr(kind) for kind in ITEM_TYPES)} items", "input")
    return messages
