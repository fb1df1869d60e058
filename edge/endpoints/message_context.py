"""A Messages request's `context_management.edits` (Anthropic's context editing), applied to the conversation
before it is rendered, as Anthropic applies them before the prompt reaches the model; the client keeps its
whole history.

- `clear_thinking_20251015`: the thinking of all but the last `keep` assistant turns that have some is
  dropped (`keep`: `{type: thinking_turns, value}`, 1 by default, or "all").
- `clear_tool_uses_20250919` with a `tool_uses` trigger: once the conversation holds more tool uses than the
  trigger's `value`, the results of all but the last `keep` (3 by default) are replaced by a placeholder,
  except those of `exclude_tools`; `clear_tool_inputs` (true, or tool names) also empties their calls'
  inputs. An edit whose trigger (by default) or `clear_at_least` counts input tokens is accepted and not
  applied: the edge counts no tokens.
- `compact_*` (a summary written by another model call) is accepted and not applied.

Each edit that cleared something is reported in the answer's `context_management.applied_edits`; its
`cleared_input_tokens` is 0 (not counted here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edge.errors import ParamError
from tritongate.llm.v1 import llm_pb2

CLEAR_THINKING = "clear_thinking_20251015"
CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEARED_RESULT = "[This tool result was cleared to save context.]"


@dataclass(frozen=True)
class ClearThinking:
    keep: int | None  # the last assistant turns with thinking that keep it; None: all


@dataclass(frozen=True)
class ClearToolUses:
    trigger: int | None  # more tool uses than this clear the older ones; None: a trigger this edge cannot judge
    keep: int
    exclude: frozenset[str]
    clear_inputs: bool | frozenset[str]  # whether the cleared calls' inputs are emptied too, or of which tools


Edit = ClearThinking | ClearToolUses


def _count(value: Any, kinds: tuple[str, ...], where: str) -> tuple[str, int]:
    """A `{type, value}` count (a keep, a trigger): its type, one of `kinds`, and its value."""
    if not isinstance(value, dict) or value.get("type") not in kinds or isinstance(value.get("value"), bool) or \
            not isinstance(value.get("value"), int) or value["value"] < 0:
        raise ParamError(f"'{where}' must be an object with type {' or '.join(map(repr, kinds))} and a 'value' "
                         "of at least 0", where)
    return value["type"], value["value"]


def _names(value: Any, where: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise ParamError(f"'{where}' must be an array of tool names", where)
    return frozenset(value)


def _tool_uses_edit(edit: dict[str, Any], where: str) -> ClearToolUses:
    kind, trigger = _count(edit.get("trigger") or {"type": "input_tokens", "value": 100_000},
                           ("input_tokens", "tool_uses"), f"{where}.trigger")
    keep = _count(edit.get("keep") or {"type": "tool_uses", "value": 3}, ("tool_uses",), f"{where}.keep")[1]
    if edit.get("clear_at_least") is not None:
        _count(edit["clear_at_least"], ("input_tokens",), f"{where}.clear_at_least")
    inputs = edit.get("clear_tool_inputs") or False
    judged = kind == "tool_uses" and edit.get("clear_at_least") is None
    return ClearToolUses(trigger if judged else None, keep, _names(edit.get("exclude_tools") or [],
                                                                   f"{where}.exclude_tools"),
                         inputs if isinstance(inputs, bool) else _names(inputs, f"{where}.clear_tool_inputs"))


def context_edits(value: Any) -> list[Edit]:
    """`context_management` ({edits: [...]}) checked: the edits this edge applies, in order."""
    edits = value.get("edits", []) if isinstance(value, dict) else None
    if not isinstance(edits, list):
        raise ParamError("'context_management' must be an object with an array of 'edits'", "context_management")
    found: list[Edit] = []
    for i, edit in enumerate(edits):
        where = f"context_management.edits[{i}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind == CLEAR_THINKING:
            keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
            found.append(ClearThinking(None if keep in ("all", {"type": "all"}) else
                                       _count(keep, ("thinking_turns",), f"{where}.keep")[1]))
        elif kind == CLEAR_TOOL_USES:
            found.append(_tool_uses_edit(edit, where))
        elif not (isinstance(kind, str) and kind.startswith("compact_")):
            raise ParamError(f"'{where}.type' must be {CLEAR_THINKING!r}, {CLEAR_TOOL_USES!r} or a compact edit; "
                             f"got {kind!r}", f"{where}.type")
    return found


def _clear_thinking(messages: list[llm_pb2.ChatMessage], edit: ClearThinking) -> dict[str, Any] | None:
    if edit.keep is None:
        return None
    thinking = [message for message in messages if message.role == "assistant" and message.reasoning]
    cleared = thinking[:max(len(thinking) - edit.keep, 0)]
    for message in cleared:
        message.reasoning = ""
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": len(cleared), "cleared_input_tokens": 0} \
        if cleared else None


def _clear_tool_uses(messages: list[llm_pb2.ChatMessage], edit: ClearToolUses) -> dict[str, Any] | None:
    calls = [call for message in messages if message.role == "assistant" for call in message.tool_calls]
    if edit.trigger is None or len(calls) <= edit.trigger:
        return None
    cleared = [call for call in calls[:max(len(calls) - edit.keep, 0)] if call.name not in edit.exclude]
    for call in cleared:
        if edit.clear_inputs is True or (edit.clear_inputs and call.name in edit.clear_inputs):
            call.arguments = "{}"
    ids = {call.id for call in cleared}
    for message in messages:
        if message.role == "tool" and message.tool_call_id in ids:
            message.content = CLEARED_RESULT
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(cleared), "cleared_input_tokens": 0} \
        if cleared else None


def apply_edits(messages: list[llm_pb2.ChatMessage], edits: list[Edit]) -> list[dict[str, Any]]:
    """Apply `edits` to the conversation, in place; the edits that cleared something, as `applied_edits`
    entries."""
    applied = [_clear_thinking(messages, edit) if isinstance(edit, ClearThinking) else _clear_tool_uses(messages, edit)
               for edit in edits]
    return [entry for entry in applied if entry is not None]
