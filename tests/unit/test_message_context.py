"""`context_management.edits` of a Messages request (edge/endpoints/message_context.py): thinking cleared from
all but the last turns that have some, old tool results (and inputs) cleared once a `tool_uses` trigger is
passed, edits counted in tokens accepted and not applied, each edit that cleared something reported in the
answer; bad edits refused naming their place."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from edge.endpoints import message_context, messages
from edge.errors import from_validation

TOOLS = [{"name": name, "input_schema": {"type": "object"}} for name in ("Read", "Bash", "memory")]


def turns(calls: list[str]) -> list[dict[str, Any]]:
    """A conversation in which the assistant thinks, then calls each tool of `calls` in turn."""
    found: list[dict[str, Any]] = [{"role": "user", "content": "Go."}]
    for i, name in enumerate(calls):
        found += [{"role": "assistant", "content": [
                      {"type": "thinking", "thinking": f"Thought {i}.", "signature": ""},
                      {"type": "tool_use", "id": f"toolu_{i}", "name": name, "input": {"n": i}}]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{i}",
                                                "content": f"Result {i}."}]}]
    return found


def edited(calls: list[str], *edits: dict[str, Any]) -> messages.MessagesRequest:
    return messages.MessagesRequest.model_validate({
        "model": "m", "max_tokens": 64, "tools": TOOLS, "messages": turns(calls),
        "context_management": {"edits": list(edits)}})


def history(body: messages.MessagesRequest) -> list[tuple[str, str]]:
    """Each message's thinking, call inputs or tool result, as the generation sends them."""
    shown = []
    for message in messages.generation_input(body).messages:
        if message.role == "assistant":
            shown.append((message.reasoning, " ".join(call.arguments for call in message.tool_calls)))
        elif message.role == "tool":
            shown.append(("tool", message.content))
    return shown


def test_clear_thinking_keeps_the_last_turns_thinking() -> None:
    body = edited(["Read"] * 3, {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}})
    assert [thought for thought, _ in history(body) if thought != "tool"] == ["", "", "Thought 2."]
    assert body.applied_edits == [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2,
                                   "cleared_input_tokens": 0}]
    by_default = edited(["Read"] * 2, {"type": "clear_thinking_20251015"})
    assert [thought for thought, _ in history(by_default) if thought != "tool"] == ["", "Thought 1."]


@pytest.mark.parametrize("keep", ["all", {"type": "all"}])
def test_clear_thinking_keeping_all_clears_nothing_and_reports_nothing(keep: Any) -> None:
    body = edited(["Read"] * 3, {"type": "clear_thinking_20251015", "keep": keep})
    assert [thought for thought, _ in history(body) if thought != "tool"] == ["Thought 0.", "Thought 1.", "Thought 2."]
    assert body.applied_edits == []


def test_clear_tool_uses_past_its_trigger_clears_the_oldest_results_but_excluded_tools() -> None:
    edit = {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 3},
            "keep": {"type": "tool_uses", "value": 2}, "exclude_tools": ["memory"]}
    body = edited(["Read", "memory", "Bash", "Read", "Bash"], edit)
    results = [content for role, content in history(body) if role == "tool"]
    cleared = message_context.CLEARED_RESULT
    assert results == [cleared, "Result 1.", cleared, "Result 3.", "Result 4."]
    assert body.applied_edits == [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2,
                                   "cleared_input_tokens": 0}]
    assert all(json.loads(inputs) for role, inputs in history(body) if role != "tool")  # inputs kept
    assert edited(["Read"] * 3, edit).applied_edits == []  # not past the trigger


@pytest.mark.parametrize(("clear_inputs", "emptied"), [(True, [0, 1]), (["Bash"], [1]), (False, [])])
def test_clear_tool_inputs_empties_the_cleared_calls_inputs(clear_inputs: Any, emptied: list[int]) -> None:
    body = edited(["Read", "Bash", "Read"], {"type": "clear_tool_uses_20250919", "clear_tool_inputs": clear_inputs,
                                             "trigger": {"type": "tool_uses", "value": 1},
                                             "keep": {"type": "tool_uses", "value": 1}})
    inputs = [json.loads(arguments) for role, arguments in history(body) if role != "tool"]
    assert [i for i, given in enumerate(inputs) if not given] == emptied


@pytest.mark.parametrize("edit", [
    {"type": "clear_tool_uses_20250919"},  # by default past 100,000 input tokens
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10}},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "tool_uses", "value": 1},
     "clear_at_least": {"type": "input_tokens", "value": 5000}},
    {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}},
])
def test_edits_counted_in_tokens_are_accepted_and_not_applied(edit: dict[str, Any]) -> None:
    body = edited(["Read"] * 5, edit)
    assert [content for role, content in history(body) if role == "tool"] == [f"Result {i}." for i in range(5)]
    assert body.applied_edits == []


def test_a_request_without_context_management_reports_none() -> None:
    body = messages.MessagesRequest.model_validate({"model": "m", "max_tokens": 64, "messages": turns(["Read"])})
    assert body.applied_edits is None and history(body)[0][0] == "Thought 0."


@pytest.mark.parametrize(("context_management", "param"), [
    ([], "context_management"),
    ({"edits": {}}, "context_management"),
    ({"edits": [{"type": "clear_everything"}]}, "context_management.edits[0].type"),
    ({"edits": ["clear_thinking_20251015"]}, "context_management.edits[0].type"),
    ({"edits": [{"type": "clear_thinking_20251015", "keep": 1}]}, "context_management.edits[0].keep"),
    ({"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": -1}}]},
     "context_management.edits[0].keep"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "trigger": {"type": "turns", "value": 3}}]},
     "context_management.edits[0].trigger"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": "3"}}]},
     "context_management.edits[0].keep"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "exclude_tools": "Read"}]},
     "context_management.edits[0].exclude_tools"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "clear_tool_inputs": [1]}]},
     "context_management.edits[0].clear_tool_inputs"),
    ({"edits": [{"type": "clear_tool_uses_20250919", "clear_at_least": {"type": "tool_uses", "value": 1}}]},
     "context_management.edits[0].clear_at_least"),
])
def test_bad_edits_are_refused_naming_their_place(context_management: Any, param: str) -> None:
    with pytest.raises(ValidationError) as refused:
        messages.MessagesRequest.model_validate({"model": "m", "max_tokens": 64, "messages": turns([]),
                                                 "context_management": context_management})
    assert from_validation(RequestValidationError(refused.value.errors(), body=None)).param == param
