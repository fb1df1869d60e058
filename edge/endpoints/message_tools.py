"""The kinds of tool in a Messages request's `tools`, and `tool_choice`.

- Custom tools (`{name, description, input_schema}`, `type` absent or "custom"): offered as functions.
- Anthropic-defined client tools, which the client runs (`bash_*`, `text_editor_*`, `memory_*`): offered
  as functions with Anthropic's published input schemas, under the name the request gives.
- Server tools, which Anthropic runs itself (any other `type`: `web_search_*`, `web_fetch_*`,
  `code_execution_*`, `tool_search_tool_*`, `mcp_toolset`, ...): no model can run them here, so they are
  hosted tools (edge/generation.py), never offered.
- A tool with `defer_loading: true` is offered only once the conversation loads it (a `tool_reference`
  block, or a system turn's `tool_addition`; a `tool_removal` withdraws a tool): see `ToolChange`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from edge.endpoints.tools import MAX_TOOLS, NAME, function_tool
from edge.errors import ParamError
from edge.generation import Tooling
from tritongate.llm.v1 import llm_pb2

TOOL_CHOICES = ("auto", "any", "tool", "none")
_EDITED = {"path": {"type": "string", "description": "Absolute path of the file or directory."},
           "file_text": {"type": "string", "description": "`create`: the new file's content."},
           "old_str": {"type": "string", "description": "`str_replace`: the exact text to replace."},
           "new_str": {"type": "string", "description": "`str_replace`: its replacement; `insert`: the text."},
           "insert_line": {"type": "integer", "description": "`insert`: the line after which to insert."},
           "view_range": {"type": "array", "items": {"type": "integer"},
                          "description": "`view`: the first and last line to show (-1: to the end)."}}


def _editor(commands: list[str]) -> tuple[str, dict[str, Any]]:
    return (f"View, create and edit text files ({', '.join(commands)}).",
            {"type": "object", "properties": {"command": {"type": "string", "enum": commands}, **_EDITED},
             "required": ["command", "path"]})


EDITOR_COMMANDS = ["view", "create", "str_replace", "insert"]
# Each Anthropic-defined client tool, by its type's name before the date: its description and its published
# input schema (the text editors of UNDOING_EDITORS also take `undo_edit`).
CLIENT_TOOLS: dict[str, tuple[str, dict[str, Any]]] = {
    "bash": ("Run a command in a persistent bash shell.", {"type": "object", "properties": {
        "command": {"type": "string", "description": "The command to run."},
        "restart": {"type": "boolean", "description": "Restart the shell instead of running a command."}}}),
    "text_editor": _editor(EDITOR_COMMANDS),
    "memory": ("Keep notes across conversations as files under /memories (view, create, str_replace, insert, "
               "delete, rename).", {"type": "object", "properties": {
                   "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete",
                                                           "rename"]},
                   **{key: _EDITED[key] for key in ("path", "view_range", "file_text", "old_str", "new_str",
                                                    "insert_line")},
                   "insert_text": {"type": "string", "description": "`insert`: the text."},
                   "old_path": {"type": "string", "description": "`rename`: the current path."},
                   "new_path": {"type": "string", "description": "`rename`: the new path."}},
                   "required": ["command"]}),
}
UNDOING_EDITORS = {"text_editor_20241022", "text_editor_20250124"}
_UNDOING_EDITOR = _editor([*EDITOR_COMMANDS, "undo_edit"])
_CLIENT_TYPE = re.compile(r"^(bash|text_editor|memory)_\d{8}$")


def client_tool(kind: str) -> tuple[str, dict[str, Any]] | None:
    """The description and input schema of the Anthropic-defined client tool of type `kind`; None: not one."""
    match = _CLIENT_TYPE.match(kind)
    if match is None:
        return None
    return _UNDOING_EDITOR if kind in UNDOING_EDITORS else CLIENT_TOOLS[match[1]]


def _defined_tool(entry: dict[str, Any], described: tuple[str, dict[str, Any]], where: str) -> llm_pb2.Tool:
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamError(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-': the name the model calls "
                         "the tool by", f"{where}.name")
    return llm_pb2.Tool(name=name, description=described[0], parameters=json.dumps(described[1]))


@dataclass(frozen=True)
class ToolChange:
    """A tool the conversation loads (`offered`) or withdraws, by name."""

    name: str
    offered: bool


@dataclass(frozen=True)
class MessageTools:
    """`tools` by kind: every tool the client runs (in order), the names of those deferred (offered once
    loaded), and the server tools (hosted; by name, where they have one)."""

    tools: list[llm_pb2.Tool] = field(default_factory=list)
    deferred: frozenset[str] = frozenset()
    hosted: list[llm_pb2.HostedTool] = field(default_factory=list)
    hosted_names: frozenset[str] = frozenset()

    def offered(self, changes: Iterable[ToolChange]) -> list[llm_pb2.Tool]:
        """The tools offered to the model after the conversation's loads and withdrawals (a change naming no
        tool of `tools` is history that no longer matters: ignored)."""
        offered = {tool.name: tool.name not in self.deferred for tool in self.tools}
        for change in changes:
            if change.name in offered:
                offered[change.name] = change.offered
        return [tool for tool in self.tools if offered[tool.name]]


def message_tools(value: Any) -> MessageTools:
    """`tools`: each entry a custom tool, an Anthropic-defined client tool or a server tool; names unique."""
    if not isinstance(value, list):
        raise ParamError("'tools' must be an array", "tools")
    if len(value) > MAX_TOOLS:
        raise ParamError(f"'tools' may hold at most {MAX_TOOLS} tools; got {len(value)}", "tools")
    tools: list[llm_pb2.Tool] = []
    hosted: list[llm_pb2.HostedTool] = []
    deferred: set[str] = set()
    hosted_names: set[str] = set()
    for i, entry in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(entry, dict):
            raise ParamError(f"'{where}' must be an object with 'name' and 'input_schema'", where)
        kind = "custom" if entry.get("type") is None else entry["type"]
        if not isinstance(kind, str):
            raise ParamError(f"'{where}.type' must be a string", f"{where}.type")
        described = client_tool(kind)
        if kind != "custom" and described is None:
            hosted.append(llm_pb2.HostedTool(type=kind, param=where))
            if isinstance(entry.get("name"), str):
                hosted_names.add(entry["name"])
            continue
        if described is None and not isinstance(entry.get("input_schema"), dict):
            raise ParamError(f"'{where}.input_schema' is required: a JSON Schema object", f"{where}.input_schema")
        tool = function_tool(entry, where, where, "input_schema") if described is None else \
            _defined_tool(entry, described, where)
        if any(known.name == tool.name for known in tools):
            raise ParamError(f"'tools' names the tool {tool.name!r} more than once", f"{where}.name")
        tools.append(tool)
        if entry.get("defer_loading") is True:
            deferred.add(tool.name)
    return MessageTools(tools, frozenset(deferred), hosted, frozenset(hosted_names))


def _named(name: Any, tools: MessageTools, offered: list[llm_pb2.Tool]) -> llm_pb2.ToolChoice:
    if any(tool.name == name for tool in offered):
        return llm_pb2.ToolChoice(mode="function", function=name)
    if name in tools.hosted_names:
        why = "a server tool, which cannot run here"
    elif name in tools.deferred:
        why = "deferred (defer_loading) and not loaded by the conversation"
    else:
        why = "not in 'tools'"
    raise ParamError(f"'tool_choice.name' names the tool {name!r}, which is {why}", "tool_choice.name")


def tool_choice(value: Any, tools: MessageTools, offered: list[llm_pb2.Tool]) -> Tooling:
    """`tool_choice` ({type: auto | any | tool (with `name`) | none, disable_parallel_tool_use}) over the
    offered tools, as chat's choice and whether calls may be parallel (None: the default)."""
    if value is None:
        return Tooling(offered, llm_pb2.ToolChoice(mode="auto" if offered else "none"))
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in TOOL_CHOICES:
        raise ParamError("'tool_choice' must be an object with type 'auto', 'any', 'tool' or 'none'", "tool_choice")
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ParamError("'tool_choice.disable_parallel_tool_use' must be a boolean",
                         "tool_choice.disable_parallel_tool_use")
    parallel = None if parallel is None else not parallel
    if kind == "tool":
        return Tooling(offered, _named(value.get("name"), tools, offered), parallel)
    if kind == "any" and not offered:
        raise ParamError(f"'tool_choice' of type {kind!r} needs 'tools' the model may call", "tool_choice")
    return Tooling(offered, llm_pb2.ToolChoice(mode="required" if kind == "any" else str(kind)), parallel)
