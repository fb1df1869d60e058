"""A Messages request's `messages` and `system` as the generation's chat messages: each turn's content blocks
become chat messages (`text`; an assistant's `tool_use` blocks its tool calls and its `thinking` its
reasoning; each `tool_result` a tool message answering the `tool_use` of the assistant turn before; a
`system` turn a system message where it stands; consecutive turns of one role joined into one, as Anthropic
does), a user turn's `image` blocks its images (loaded by edge/images.py), and the tools the conversation
loads or withdraws (`tool_reference` blocks, a system turn's `tool_addition` and `tool_removal`: see
edge/endpoints/message_tools.py). `cache_control` is accepted on every block and changes nothing here. A
refused block names its place (`messages[2].content[0].tool_use_id`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from edge.endpoints.message_tools import ToolChange
from edge.endpoints.tools import schema_text
from edge.errors import ParamError
from edge.images import PendingImage
from tritongate.llm.v1 import llm_pb2

ROLES = ("user", "assistant", "system")
Blocks = list[tuple[dict[str, Any], str]]  # a turn's content blocks, each with its place in the request

MIN_THINKING_BUDGET = 1024  # Anthropic's least `budget_tokens`
THINKING_DISPLAYS = ("summarized", "omitted", "updates")
EFFORTS = ("low", "medium", "high", "xhigh", "max")



@dataclass
class _Found:
    """What a conversation holds beside its messages: the images of its user turns, the tools it loads."""

    images: list[PendingImage] = field(default_factory=list)
    changes: list[ToolChange] = field(default_factory=list)


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


def _reference(part: dict[str, Any], where: str) -> ToolChange:
    """A `tool_reference` block: its tool is loaded from here on."""
    return ToolChange(_string(part, "tool_name", where), offered=True)


def _tool_result_text(block: dict[str, Any], where: str, found: _Found) -> str:
    """A `tool_result`'s content: a string, or text blocks (joined with newlines); a `tool_reference` block
    (a tool search's answer) loads its tool and reads as its name."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"'{where}.content' must be a string or an array of text blocks", f"{where}.content")
    texts = []
    for k, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "tool_reference":
            found.changes.append(_reference(part, f"{where}.content[{k}]"))
            texts.append(found.changes[-1].name)
            continue
        if kind != "text":
            raise ParamError(f"'{where}.content[{k}]': blocks of type {kind!r} are not supported in a tool_result: "
                             "only text and tool_reference", f"{where}.content[{k}]")
        texts.append(_string(part, "text", f"{where}.content[{k}]"))
    return "\n".join(texts)


def _user_turn(blocks: Blocks, calls: set[str], found: _Found) -> list[llm_pb2.ChatMessage]:
    """A user turn: a tool message per `tool_result` (answering a `tool_use` of `calls`, the assistant turn
    before's), then the text and images as one user message (its images found, to be loaded later)."""
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
                                                content=_tool_result_text(block, where, found)))
        else:
            raise ParamError(f"'{where}.type': blocks of type {kind!r} are not supported in a user turn: only "
                             "text, image and tool_result", f"{where}.type")
    if texts or images:
        messages.append(llm_pb2.ChatMessage(role="user", content="\n".join(texts)))
        found.images.extend(PendingImage(messages[-1], url, param) for url, param in images)
    return messages


def _searched(block: dict[str, Any], where: str) -> list[ToolChange]:
    """The tools a `tool_search_tool_result` (Anthropic's tool search's answer) loads."""
    content = block.get("content")
    references = content.get("tool_references", []) if isinstance(content, dict) else None
    if not isinstance(references, list) or not all(isinstance(part, dict) for part in references):
        raise ParamError(f"'{where}.content' must be an object whose 'tool_references' is an array of "
                         "tool_reference blocks", f"{where}.content")
    return [_reference(part, f"{where}.content.tool_references[{k}]") for k, part in enumerate(references)]


def _assistant_turn(blocks: Blocks, found: _Found) -> llm_pb2.ChatMessage:
    """An assistant turn: its text, its `tool_use` blocks as calls, its `thinking` as the reasoning; a
    server tool's use (run by Anthropic, never here) is dropped, the tools its tool search found loaded."""
    message = llm_pb2.ChatMessage(role="assistant")
    texts, thoughts = [], []
    for block, where in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thoughts.append(_string(block, "thinking", where))
        elif kind in ("redacted_thinking", "server_tool_use"):
            continue  # another model's encrypted thinking, a server tool's call: nothing this model can use
        elif kind == "tool_search_tool_result":
            found.changes += _searched(block, where)
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
                             "only text, thinking, redacted_thinking, tool_use, server_tool_use and "
                             "tool_search_tool_result", f"{where}.type")
    message.content = "\n".join(texts)
    message.reasoning = "\n".join(thoughts)
    return message


def _system_turn(blocks: Blocks, found: _Found) -> list[llm_pb2.ChatMessage]:
    """A system turn: its text as a system message where it stands; its `tool_addition` and `tool_removal`
    blocks load and withdraw tools of `tools` (named by a `tool_reference`)."""
    texts = []
    for block, where in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind in ("tool_addition", "tool_removal"):
            tool = block.get("tool")
            if not isinstance(tool, dict) or tool.get("type") != "tool_reference":
                raise ParamError(f"'{where}.tool' must be a tool_reference ({{type: tool_reference, name}}) to a "
                                 "tool of 'tools'", f"{where}.tool")
            found.changes.append(ToolChange(_string(tool, "name", f"{where}.tool"), kind == "tool_addition"))
        else:
            raise ParamError(f"'{where}.type': blocks of type {kind!r} are not supported in a system turn: only "
                             "text, tool_addition and tool_removal", f"{where}.type")
    return [llm_pb2.ChatMessage(role="system", content="\n".join(texts))] if texts else []


@dataclass(frozen=True)
class Conversation:
    """`messages` as chat messages, the images of its user turns (loaded before the request goes out), and
    the tools it loads or withdraws, in order."""

    messages: list[llm_pb2.ChatMessage]
    images: list[PendingImage]
    tool_changes: list[ToolChange] = field(default_factory=list)


def _turns(value: list[Any]) -> list[tuple[str, Blocks]]:
    """Each turn's role and blocks, consecutive turns of one role joined; a system turn that asks to be shown
    only until the next user turn (`clear_at: next_user_message`) is left out once one follows."""
    last_user = max((i for i, turn in enumerate(value) if isinstance(turn, dict) and turn.get("role") == "user"),
                    default=-1)
    turns: list[tuple[str, Blocks]] = []
    for i, turn in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise ParamError(f"'{where}' must be an object with 'role' and 'content'", where)
        role = turn.get("role")
        if role not in ROLES:
            raise ParamError(f"'{where}.role' must be 'user', 'assistant' or 'system'; got {role!r}", f"{where}.role")
        clear_at = turn.get("clear_at")
        if clear_at not in (None, "never", "next_user_message") or (clear_at and role != "system"):
            raise ParamError(f"'{where}.clear_at' is a system turn's, 'next_user_message' or 'never'",
                             f"{where}.clear_at")
        if clear_at == "next_user_message" and i < last_user:
            continue
        blocks = [(block, f"{where}.content[{j}]") for j, block in
                  enumerate(_blocks(turn.get("content"), f"{where}.content"))]
        if isinstance(turn.get("content"), str):
            blocks = [(blocks[0][0], f"{where}.content")]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    if all(role == "system" for role, _ in turns):
        raise ParamError("'messages[0].role': the conversation has only system turns (a system prompt alone goes "
                         "in the top-level 'system')", "messages[0].role")
    return turns


def chat_messages(value: Any) -> Conversation:
    """`messages`: user, assistant and system turns, consecutive turns of one role joined (as Anthropic does)."""
    if not isinstance(value, list) or not value:
        raise ParamError("'messages' must be a non-empty array of turns", "messages")
    messages: list[llm_pb2.ChatMessage] = []
    found = _Found()
    calls: set[str] = set()  # the ids of the last assistant turn's tool_use blocks
    for role, blocks in _turns(value):
        if role == "user":
            messages += _user_turn(blocks, calls, found)
        elif role == "system":
            messages += _system_turn(blocks, found)
        else:
            messages.append(_assistant_turn(blocks, found))
            calls = {call.id for call in messages[-1].tool_calls}
    return Conversation(messages, found.images, found.changes)


def system_text(value: Any) -> str:
    """`system`: a string, or text blocks (joined with newlines)."""
    if isinstance(value, str):
        return value
    blocks = _blocks(value, "system")
    for j, block in enumerate(blocks):
        if block["type"] != "text":
            raise ParamError(f"'system[{j}].type': only text blocks are allowed in 'system'", f"system[{j}].type")
    return "\n".join(_string(block, "text", f"system[{j}]") for j, block in enumerate(blocks))


@dataclass(frozen=True)
class Thinking:
    """`thinking`, checked: the chat template's `enable_thinking` (None: the template's default, which
    `adaptive` leaves to the model), the budget it was given, and whether the answer shows the thinking's
    text (`display: omitted`: its thinking blocks are empty, as Anthropic's)."""

    enabled: bool | None
    budget_tokens: int = 0
    shown: bool = True


def thinking_of(value: Any) -> Thinking | None:
    """`thinking`: {type: enabled, budget_tokens, display}, {type: adaptive, display} or {type: disabled}."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return Thinking(enabled=False)
    if kind not in ("enabled", "adaptive"):
        raise ParamError("'thinking' must be an object with type 'enabled' (and 'budget_tokens'), 'adaptive' or "
                         "'disabled'", "thinking")
    assert isinstance(value, dict)
    display = value.get("display")
    if display not in (None, *THINKING_DISPLAYS):
        raise ParamError(f"'thinking.display' must be one of {', '.join(THINKING_DISPLAYS)}", "thinking.display")
    if kind == "adaptive":
        return Thinking(enabled=None, shown=display != "omitted")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        raise ParamError(f"'thinking.budget_tokens' must be an integer of at least {MIN_THINKING_BUDGET}",
                         "thinking.budget_tokens")
    return Thinking(enabled=True, budget_tokens=budget, shown=display != "omitted")


@dataclass(frozen=True)
class OutputConfig:
    """`output_config`, checked: the effort (the chat template's `reasoning_effort`) and the output's format."""

    effort: str | None = None
    guide: llm_pb2.Guide | None = None


def output_config(value: Any) -> OutputConfig:
    """`output_config`: {effort: low | medium | high | xhigh | max, format: {type: json_schema, schema}}."""
    if not isinstance(value, dict):
        raise ParamError("'output_config' must be an object", "output_config")
    effort, form = value.get("effort"), value.get("format")
    if effort not in (None, *EFFORTS):
        raise ParamError(f"'output_config.effort' must be one of {', '.join(EFFORTS)}", "output_config.effort")
    if form is None:
        return OutputConfig(effort)
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        raise ParamError("'output_config.format' must be an object with type 'json_schema' and a 'schema'",
                         "output_config.format")
    return OutputConfig(effort, llm_pb2.Guide(json_schema=schema_text(form.get("schema"), "output_config.format",
                                                                      "'output_config.format.schema'")))
