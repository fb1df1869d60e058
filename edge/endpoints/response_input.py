"""A Responses request's `input` as the generation's chat messages: message items (a `developer` message,
wherever it stands, is a system message), and the calls of an earlier answer (`function_call` and
`custom_tool_call` items, a namespace's tools under `<namespace>.<name>` as the model was offered them) with
their results (`function_call_output`, `custom_tool_call_output`), which become chat's assistant
`tool_calls` and `tool` messages, so that an agent's next turn reads as chat's would. A `reasoning` item is
the thinking of the assistant message after it: from its `encrypted_content` when this server wrote it
(edge/endpoints/encrypted_content.py), else from its `reasoning_text` content; an `encrypted_content` of
another server's is ignored. Items' `id`s are accepted and not read. A refused item names its own place in
the request (`input[3].content`). A message's `input_image` parts become its images (loaded by
edge/images.py, as chat's `image_url` parts).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from edge.endpoints.encrypted_content import thinking_of
from edge.endpoints.response_tools import qualified
from edge.errors import ParamError
from edge.images import PendingImage
from tritongate.llm.v1 import llm_pb2

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
ITEM_TYPES = ("message", "function_call", "function_call_output", "custom_tool_call", "custom_tool_call_output",
              "reasoning")
OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")


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


def _name(item: dict[str, Any], where: str) -> str:
    """A call's tool, as the model was offered it (`<namespace>.<name>` in a namespace)."""
    namespace = item.get("namespace")
    if namespace is not None and (not isinstance(namespace, str) or not namespace):
        raise ParamError(f"'{where}.namespace' must be a non-empty string", f"{where}.namespace")
    return qualified(_string(item, "name", where), namespace)


def _call(item: dict[str, Any], where: str) -> llm_pb2.ToolCall:
    """A `function_call` item (arguments: JSON text) or a `custom_tool_call` item (input: any text) as an
    entry of chat's `tool_calls`."""
    custom = item.get("type") == "custom_tool_call"
    field = "input" if custom else "arguments"
    text = item.get(field)
    if not isinstance(text, str):
        what = "the tool's input" if custom else "the call's arguments as JSON"
        raise ParamError(f"'{where}.{field}' must be a string ({what})", f"{where}.{field}")
    return llm_pb2.ToolCall(id=_string(item, "call_id", where), name=_name(item, where), arguments=text,
                            custom=custom)


def _thinking(item: dict[str, Any], where: str) -> str:
    """A reasoning item's thinking: ours from `encrypted_content`, else its `reasoning_text` parts."""
    ours = thinking_of(item.get("encrypted_content"))
    if ours is not None:
        return ours
    content = item.get("content")
    if content is None:
        return ""
    if not isinstance(content, list) or not all(
            isinstance(part, dict) and isinstance(part.get("text"), str) for part in content):
        raise ParamError(f"'{where}.content' must be an array of reasoning_text parts", f"{where}.content")
    return "\n".join(part["text"] for part in content)


def _message(item: dict[str, Any], where: str, pending: list[PendingImage]) -> llm_pb2.ChatMessage:
    role = item.get("role")
    if role not in ROLES:
        raise ParamError(f"'{where}.role' must be one of {', '.join(ROLES)}; got {role!r}", f"{where}.role")
    images: list[tuple[str, Any]] = []
    message = llm_pb2.ChatMessage(role="system" if role == "developer" else role, content=_item_text(
        item.get("content"), f"{where}.content", images if role == "user" else None))
    pending.extend(PendingImage(message, url, param) for param, url in images)
    return message


class _Conversation:
    """The messages so far, and the thinking that the next assistant message carries."""

    def __init__(self) -> None:
        self.messages: list[llm_pb2.ChatMessage] = []
        self.thinking: list[str] = []

    def add(self, message: llm_pb2.ChatMessage) -> None:
        if message.role == "assistant" and self.thinking:
            message.reasoning = "\n".join(self.thinking)
        if message.role == "assistant" or message.role == "user":
            self.thinking = []  # thinking before a user message belongs to no answer
        self.messages.append(message)

    def add_call(self, call: llm_pb2.ToolCall) -> None:
        """Calls that follow an assistant message (its text, or calls made with it) belong to that message,
        as one chat answer holds its text and all its calls; thinking before a call opens a new answer."""
        last = self.messages[-1] if self.messages else None
        if last is not None and last.role == "assistant" and not self.thinking:
            last.tool_calls.append(call)
        else:
            self.add(llm_pb2.ChatMessage(role="assistant", tool_calls=[call]))


def input_messages(value: Any) -> InputMessages:
    """`input`: a string (one user message) or input items; any other item type is refused by name."""
    if isinstance(value, str):
        if not value:
            raise ParamError("'input' must not be empty", "input")
        return InputMessages([llm_pb2.ChatMessage(role="user", content=value)], [])
    if not isinstance(value, list) or not value:
        raise ParamError("'input' must be a non-empty string or a non-empty array of input items", "input")
    conversation = _Conversation()
    images: list[PendingImage] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ParamError(f"'{where}' must be an object (an input item)", where)
        kind = item.get("type", "message")
        if kind == "message":
            conversation.add(_message(item, where, images))
        elif kind in ("function_call", "custom_tool_call"):
            conversation.add_call(_call(item, where))
        elif kind in OUTPUT_TYPES:
            conversation.add(llm_pb2.ChatMessage(role="tool", tool_call_id=_string(item, "call_id", where),
                                                 content=_item_text(item.get("output"), f"{where}.output")))
        elif kind == "reasoning" and (thinking := _thinking(item, where)):
            conversation.thinking.append(thinking)
        elif kind == "reasoning":
            continue  # no thinking to replay (a summary only, or another server's encrypted_content)
        else:
            raise ParamError(f"'{where}.type': input items of type {kind!r} are not supported: only "
                             f"{', '.join(repr(kind) for kind in ITEM_TYPES)} items", f"{where}.type")
    return InputMessages(conversation.messages, images)
