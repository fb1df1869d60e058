"""A Responses request's `input` as the generation's chat messages: message items, and the function calls
of an earlier answer (`function_call` items) with their results (`function_call_output` items), which
become chat's assistant `tool_calls` and `tool` messages, so that an agent's next turn reads as chat's
would. A refused item names its own place in the request (`input[3].content`). A message's
`input_image` parts become its images (loaded by edge/images.py, as chat's `image_url` parts).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from edge.errors import ParamError
from edge.images import PendingImage
from tritongate.llm.v1 import llm_pb2

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
ITEM_TYPES = ("message", "function_call", "function_call_output")

class InputMessages(NamedTuple):
    """`input` as chat messages, and the images their `input_image` parts name."""

    messages: list[llm_pb2.ChatMessage]
    images: list[PendingImage]


def _item_text(content: Any, where: str, images: list[tuple[str, Any]] | None = None) -> str:
    """A message item's content (or a call output): a string, or text parts (joined with newlines); with
    `images`, a user message's `input_image` parts are added to it as (parameter, URL)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"'{where}' must be a string or an array of content parts", where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_image" and images is not None and isinstance(part.get("image_url"), str):
            images.append((f"{where}[{j}].image_url", part["image_url"]))
        elif kind == "input_image" and images is not None:
            raise ParamError(f"'{where}[{j}].image_url' must be a string (a data: or http(s) URL; file_id is not "
                             "supported)", f"{where}[{j}].image_url")
        else:
            accepted = "input_text, output_text and, in user messages, input_image" if images is not None \
                else "input_text and output_text"
            raise ParamError(f"'{where}[{j}]': content parts of type {kind!r} are not supported: only "
                             f"{accepted}", f"{where}[{j}]")
    return "\n".join(texts)


def _string(item: dict[str, Any], field: str, where: str) -> str:
    value = item.get(field)
    if not isinstance(value, str) or not value:
        raise ParamError(f"'{where}.{field}' must be a non-empty string", f"{where}.{field}")
    return value


def _call(item: dict[str, Any], where: str) -> llm_pb2.ToolCall:
    """A `function_call` item as an entry of chat's `tool_calls`."""
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise ParamError(f"'{where}.arguments' must be a string (the call's arguments as JSON)", f"{where}.arguments")
    return llm_pb2.ToolCall(id=_string(item, "call_id", where), name=_string(item, "name", where),
                            arguments=arguments)


def _message(item: dict[str, Any], where: str, pending: list[PendingImage]) -> llm_pb2.ChatMessage:
    role = item.get("role")
    if role not in ROLES:
        raise ParamError(f"'{where}.role' must be one of {', '.join(ROLES)}; got {role!r}", f"{where}.role")
    images: list[tuple[str, Any]] = []
    message = llm_pb2.ChatMessage(role="system" if role == "developer" else role, content=_item_text(
        item.get("content"), f"{where}.content", images if role == "user" else None))
    pending.extend(PendingImage(message, url, param) for param, url in images)
    return message


def _add_call(messages: list[llm_pb2.ChatMessage], call: llm_pb2.ToolCall) -> None:
    """Calls that follow an assistant message (its text, or calls made with it) belong to that message,
    as one chat answer holds its text and all its calls."""
    if messages and messages[-1].role == "assistant":
        messages[-1].tool_calls.append(call)
    else:
        messages.append(llm_pb2.ChatMessage(role="assistant", tool_calls=[call]))


def input_messages(value: Any) -> InputMessages:
    """`input`: a string (one user message) or input items; any other item type is refused by name."""
    if isinstance(value, str):
        if not value:
            raise ParamError("'input' must not be empty", "input")
        return InputMessages([llm_pb2.ChatMessage(role="user", content=value)], [])
    if not isinstance(value, list) or not value:
        raise ParamError("'input' must be a non-empty string or a non-empty array of input items", "input")
    messages: list[llm_pb2.ChatMessage] = []
    images: list[PendingImage] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ParamError(f"'{where}' must be an object (an input item)", where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where, images))
        elif kind == "function_call":
            _add_call(messages, _call(item, where))
        elif kind == "function_call_output":
            messages.append(llm_pb2.ChatMessage(role="tool", tool_call_id=_string(item, "call_id", where),
                                                content=_item_text(item.get("output"), f"{where}.output")))
        else:
            raise ParamError(f"'{where}.type': input items of type {kind!r} are not supported: only "
                             f"{', '.join(repr(kind) for kind in ITEM_TYPES)} items", f"{where}.type")
    return InputMessages(messages, images)
