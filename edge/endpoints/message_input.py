"""A Messages request's `messages` and `system` as the generation's chat messages: each turn's content blocks
become chat messages (`text`; an assistant's `tool_use` blocks its tool calls and its `thinking` its
reasoning; each `tool_result` a tool message answering the `tool_use` of the turn before; consecutive turns
of one role joined into one, as Anthropic does), and a user turn's `image` blocks its images (loaded by
edge/images.py). A refused block names its place (`messages[2].content[0].tool_use_id`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from edge.errors import ParamError
from edge.images import PendingImage
from tritongate.llm.v1 import llm_pb2


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A turn's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise ParamError(f"'{where}' must be a string or a non-empty array of content blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ParamError(f"'{where}[{j}]' must be an object with a 'type'", f"{where}[{j}]")
    return content


def _string(block: dict[str, Any], field: str, where: str) -> str:
    value = block.get(field)
    if not isinstance(value, str):
        raise ParamError(f"'{where}.{field}' must be a string", f"{where}.{field}")
    return value


def image_url(block: dict[str, Any], where: str) -> tuple[str, str]:
    """An `image` block's picture as a URL for the image loader (edge/images.py), with the
    parameter that holds it: its `source`'s base64 `data` (as a `data:` URL) or its `url`."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        assert isinstance(source, dict)
        media_type = _string(source, "media_type", f"{where}.source")
        return f"data:{media_type};base64,{_string(source, 'data', f'{where}.source')}", f"{where}.source.data"
    if kind == "url":
        assert isinstance(source, dict)
        return _string(source, "url", f"{where}.source"), f"{where}.source.url"
    raise ParamError(f"'{where}.source' must be an object with type 'base64' (media_type, data) or 'url'",
                     f"{where}.source")


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    """A `tool_result`'s content: a string, or text blocks (joined with newlines)."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"'{where}.content' must be a string or an array of text blocks", f"{where}.content")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else None
            raise ParamError(f"'{where}.content[{k}]': blocks of type {kind!r} are not supported in a tool_result: "
                             "only text", f"{where}.content[{k}]")
        texts.append(_string(part, "text", f"{where}.content[{k}]"))
    return "\n".join(texts)


def _user_turn(blocks: list[tuple[dict[str, Any], str]], calls: set[str], pending: list[PendingImage]
               ) -> list[llm_pb2.ChatMessage]:
    """A user turn: a tool message per `tool_result` (answering a `tool_use` of `calls`, the turn before's),
    then the text and images as one user message (its images added to `pending`, loaded later)."""
    messages, texts, images = [], [], []
    for block, where in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "image":
            images.append(image_url(block, where))
        elif kind == "tool_result":
            call_id = _string(block, "tool_use_id", where)
            if call_id not in calls:
                raise ParamError(f"'{where}.tool_use_id': {call_id!r} answers no tool_use block of the previous "
                                 "assistant turn", f"{where}.tool_use_id")
            messages.append(llm_pb2.ChatMessage(role="tool", tool_call_id=call_id,
                                                content=_tool_result_text(block, where)))
        else:
            raise ParamError(f"'{where}.type': blocks of type {kind!r} are not supported in a user turn: only "
                             "text, image and tool_result", f"{where}.type")
    if texts or images:
        messages.append(llm_pb2.ChatMessage(role="user", content="\n".join(texts)))
        pending += [PendingImage(messages[-1], url, param) for url, param in images]
    return messages


def _assistant_turn(blocks: list[tuple[dict[str, Any], str]]) -> llm_pb2.ChatMessage:
    """An assistant turn: its text, its `tool_use` blocks as calls, its `thinking` as the reasoning."""
    message = llm_pb2.ChatMessage(role="assistant")
    texts, thoughts = [], []
    for block, where in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thoughts.append(_string(block, "thinking", where))
        elif kind == "redacted_thinking":
            continue  # another model's encrypted thinking: nothing this one can read
        elif kind == "tool_use":
            call_input = block.get("input")
            if not isinstance(call_input, dict):
                raise ParamError(f"'{where}.input' must be an object", f"{where}.input")
            call_id = _string(block, "id", where)
            if not call_id:
                raise ParamError(f"'{where}.id' must not be empty", f"{where}.id")
            message.tool_calls.append(llm_pb2.ToolCall(id=call_id, name=_string(block, "name", where),
                                                       arguments=json.dumps(call_input, ensure_ascii=False)))
        else:
            raise ParamError(f"'{where}.type': blocks of type {kind!r} are not supported in an assistant turn: "
                             "only text, thinking and tool_use", f"{where}.type")
    message.content = "\n".join(texts)
    message.reasoning = "\n".join(thoughts)
    return message


@dataclass(frozen=True)
class Conversation:
    """`messages` as chat messages, and the images of its user turns (loaded before the request goes out)."""

    messages: list[llm_pb2.ChatMessage]
    images: list[PendingImage]


def chat_messages(value: Any) -> Conversation:
    """`messages`: user and assistant turns, consecutive turns of one role joined (as Anthropic does)."""
    if not isinstance(value, list) or not value:
        raise ParamError("'messages' must be a non-empty array of turns", "messages")
    turns: list[tuple[str, list[tuple[dict[str, Any], str]]]] = []
    for i, turn in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise ParamError(f"'{where}' must be an object with 'role' and 'content'", where)
        role = turn.get("role")
        if role not in ("user", "assistant"):
            raise ParamError(f"'{where}.role' must be 'user' or 'assistant'; got {role!r} (the system prompt is "
                             "the top-level 'system')", f"{where}.role")
        blocks = [(block, f"{where}.content[{j}]") for j, block in
                  enumerate(_blocks(turn.get("content"), f"{where}.content"))]
        if isinstance(turn.get("content"), str):
            blocks = [(blocks[0][0], f"{where}.content")]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    messages: list[llm_pb2.ChatMessage] = []
    images: list[PendingImage] = []
    calls: set[str] = set()  # the ids of the previous assistant turn's tool_use blocks
    for role, blocks in turns:
        if role == "user":
            messages += _user_turn(blocks, calls, images)
        else:
            messages.append(_assistant_turn(blocks))
            calls = {call.id for call in messages[-1].tool_calls}
    return Conversation(messages, images)


def system_text(value: Any) -> str:
    """`system`: a string, or text blocks (joined with newlines)."""
    if isinstance(value, str):
        return value
    blocks = _blocks(value, "system")
    for j, block in enumerate(blocks):
        if block["type"] != "text":
            raise ParamError(f"'system[{j}].type': only text blocks are allowed in 'system'", f"system[{j}].type")
    return "\n".join(_string(block, "text", f"system[{j}]") for j, block in enumerate(blocks))
