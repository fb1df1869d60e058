"""The Responses API's `tools` and `tool_choice`, what the model is offered and how its calls are named
back:

- `function` tools, checked by chat's rules (edge/endpoints/tools.py);
- `custom` tools, whose call's input is free text, or text a grammar describes (`format` `{"type":
  "grammar", "syntax": "lark" | "regex", "definition"}`): a Lark grammar is converted to the grammar
  engine's EBNF here and a regular expression checked (edge/grammar.py), so that a grammar the engine
  cannot take is a 400 naming `tools[i].format.definition`, never a failed generation;
- `namespace` tools, whose function and custom tools are offered to the model as `<namespace>.<name>`
  (a name never has a dot otherwise) and answered with the client's own `namespace` and `name`;
- any other type is a hosted tool (a web search, a code interpreter, ...), which no model can run here:
  accepted, never offered, and sent to the llm service as a `HostedTool`, which logs or refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

from pydantic import WithJsonSchema

from edge.endpoints.tools import MAX_SCHEMA_BYTES, MAX_TOOLS, NAME, function_tool, tool_choice
from edge.errors import ParamError
from edge.grammar import GrammarError, lark_to_ebnf, regex_to_ebnf
from tritongate.llm.v1 import llm_pb2

# Hosted tools /openapi.json names (any other type is taken as one too).
HOSTED_TYPES = ("web_search", "web_search_2025_08_26", "web_search_preview", "web_search_preview_2025_03_11",
                "image_generation", "local_shell", "shell", "computer", "tool_search", "apply_patch")
_FUNCTION = {"type": "object", "properties": {"type": {"const": "function"}, "name": {"type": "string"},
                                              "description": {"type": "string"}, "parameters": {"type": "object"},
                                              "strict": {"type": "boolean"}}, "required": ["type", "name"]}
_FORMAT = {"anyOf": [
    {"type": "object", "properties": {"type": {"const": "text"}}, "required": ["type"]},
    {"type": "object", "properties": {"type": {"const": "grammar"}, "syntax": {"enum": ["lark", "regex"]},
                                      "definition": {"type": "string"}}, "required": ["type", "syntax", "definition"]}]}
_CUSTOM = {"type": "object", "properties": {"type": {"const": "custom"}, "name": {"type": "string"},
                                            "description": {"type": "string"}, "format": _FORMAT},
           "required": ["type", "name"]}
_NAMESPACE = {"type": "object", "properties": {
    "type": {"const": "namespace"}, "name": {"type": "string"}, "description": {"type": "string"},
    "tools": {"type": "array", "minItems": 1, "items": {"anyOf": [_FUNCTION, _CUSTOM]}}},
              "required": ["type", "name", "description", "tools"]}
_HOSTED = {"type": "object", "properties": {"type": {"enum": list(HOSTED_TYPES)}}, "required": ["type"]}
ResponseToolsJson = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "array", "items": {"anyOf": [_FUNCTION, _CUSTOM, _NAMESPACE, _HOSTED]}}, {"type": "null"}]})]
_NAMED = {"type": "object", "properties": {"type": {"enum": ["function", "custom"]}, "name": {"type": "string"},
                                           "namespace": {"type": "string"}}, "required": ["type", "name"]}
_ALLOWED = {"type": "object", "properties": {"type": {"const": "allowed_tools"}, "mode": {"enum": ["auto", "required"]},
                                             "tools": {"type": "array", "items": _NAMED}},
            "required": ["type", "mode", "tools"]}
ResponseToolChoiceJson = Annotated[Any, WithJsonSchema({"anyOf": [
    {"enum": ["none", "auto", "required"]}, _NAMED, _ALLOWED, {"type": "null"}]})]


class Called(NamedTuple):
    """A tool the model may call, as the client named it."""

    name: str
    namespace: str | None = None
    custom: bool = False


def qualified(name: str, namespace: str | None) -> str:
    """The name the model knows a tool by: a namespace's tools are `<namespace>.<name>`."""
    return f"{namespace}.{name}" if namespace else name


@dataclass(frozen=True)
class ResponseTools:
    """A request's tools: those offered to the model (`tools`, under the names the model calls them), how
    each such name reads as the client's (`called`), and the hosted tools, never offered."""

    tools: list[llm_pb2.Tool] = field(default_factory=list)
    names: dict[str, Called] = field(default_factory=dict)
    hosted: list[llm_pb2.HostedTool] = field(default_factory=list)

    def called(self, name: str) -> Called:
        """The tool the model called `name`, as the client named it (a name it was not offered: a function)."""
        return self.names.get(name) or Called(name)


def response_tools(value: Any) -> ResponseTools:
    """Responses' `tools`: names unique among the tools and namespaces, at most MAX_TOOLS offered."""
    if not isinstance(value, list):
        raise ParamError("'tools' must be an array", "tools")
    tools = ResponseTools()
    taken: set[str] = set()  # the names of the tools and namespaces so far
    for i, entry in enumerate(value):
        where = f"tools[{i}]"
        kind = entry.get("type") if isinstance(entry, dict) else None
        if not isinstance(kind, str):
            raise ParamError(f"'{where}' must be an object with a 'type'", f"{where}.type")
        if kind in ("function", "custom"):
            _offer(tools, _tool(entry, kind, where), None)
        elif kind == "namespace":
            namespace = _namespace_name(entry, where)
            for j, inner in enumerate(_namespace_tools(entry, where)):
                _offer(tools, _tool(inner, inner.get("type"), f"{where}.tools[{j}]"), namespace)
        else:
            tools.hosted.append(llm_pb2.HostedTool(type=kind, param=where))
            continue
        name = entry.get("name")
        if name in taken:
            raise ParamError(f"'tools' names {name!r} more than once (tool and namespace names must be unique)",
                             f"{where}.name")
        taken.add(name)
    if len(tools.tools) > MAX_TOOLS:
        raise ParamError(f"'tools' offers {len(tools.tools)} functions and custom tools (namespaces' included); "
                         f"at most {MAX_TOOLS} are allowed", "tools")
    return tools


def _offer(tools: ResponseTools, tool: llm_pb2.Tool, namespace: str | None) -> None:
    name = tool.name
    tool.name = qualified(name, namespace)
    tools.tools.append(tool)
    tools.names[tool.name] = Called(name, namespace, tool.custom)


def _tool(entry: Any, kind: Any, where: str) -> llm_pb2.Tool:
    """A function or custom tool."""
    if kind == "function":
        return function_tool(entry, where, "tools")
    if kind != "custom":
        raise ParamError(f"'{where}.type': a namespace holds 'function' and 'custom' tools; got {kind!r}",
                         f"{where}.type")
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamError(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'", f"{where}.name")
    description = entry.get("description")
    if description is not None and not isinstance(description, str):
        raise ParamError(f"'{where}.description' must be a string", f"{where}.description")
    grammar = _grammar(entry.get("format"), f"{where}.format")
    tool = llm_pb2.Tool(name=name, description=description or "", custom=True)
    if grammar is not None:
        tool.grammar.CopyFrom(grammar)
    return tool


def _grammar(value: Any, where: str) -> llm_pb2.Guide | None:
    """A custom tool's `format`: free text (None), or the grammar its input follows."""
    kind = value.get("type") if isinstance(value, dict) else None
    if value is None or kind == "text":
        return None
    if kind != "grammar":
        raise ParamError(f"'{where}' must be an object with type 'text' or 'grammar'", where)
    syntax, definition = value.get("syntax"), value.get("definition")
    if syntax not in ("lark", "regex"):
        raise ParamError(f"'{where}.syntax' must be 'lark' or 'regex'; got {syntax!r}", f"{where}.syntax")
    if not isinstance(definition, str) or not definition:
        raise ParamError(f"'{where}.definition' must be a non-empty string", f"{where}.definition")
    if len(definition.encode()) > MAX_SCHEMA_BYTES:
        raise ParamError(f"'{where}.definition' is {len(definition.encode())} bytes; at most {MAX_SCHEMA_BYTES} "
                         "are allowed", f"{where}.definition")
    try:
        if syntax == "lark":
            return llm_pb2.Guide(grammar=lark_to_ebnf(definition))
        regex_to_ebnf(definition)  # the engine takes the expression itself: only checked here
    except GrammarError as exc:
        raise ParamError(f"'{where}.definition': {exc}", f"{where}.definition") from None
    return llm_pb2.Guide(regex=definition)


def _namespace_name(entry: dict[str, Any], where: str) -> str:
    name = entry.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamError(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'", f"{where}.name")
    if not isinstance(entry.get("description", ""), str):
        raise ParamError(f"'{where}.description' must be a string", f"{where}.description")
    return name


def _namespace_tools(entry: dict[str, Any], where: str) -> list[dict[str, Any]]:
    """A namespace's tools: at least one, names unique."""
    tools = entry.get("tools")
    if not isinstance(tools, list) or not tools:
        raise ParamError(f"'{where}.tools': a namespace must hold at least one tool", f"{where}.tools")
    names: set[Any] = set()
    for j, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise ParamError(f"'{where}.tools[{j}]' must be an object (a function or custom tool)",
                             f"{where}.tools[{j}]")
        if tool.get("name") in names:
            raise ParamError(f"'{where}.tools' names {tool.get('name')!r} more than once", f"{where}.tools[{j}].name")
        names.add(tool.get("name"))
    return tools


def response_tool_choice(value: Any, tools: ResponseTools) -> tuple[llm_pb2.ToolChoice, list[llm_pb2.Tool]]:
    """`tool_choice` and the tools it leaves the model: "none", "auto", "required", a function or custom
    tool by name (`{"type": "function" | "custom", "name"}`, with its `namespace` for one inside a
    namespace), or `{"type": "allowed_tools", "mode", "tools"}` (only those tools offered). A hosted
    tool cannot be chosen: it cannot run here."""
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(value, dict):
        return tool_choice(value, tools.tools, "tool_choice", "flat"), tools.tools
    if kind in ("function", "custom"):
        return llm_pb2.ToolChoice(mode="function", function=_chosen(value, tools, "tool_choice")), tools.tools
    if kind == "allowed_tools":
        entries = value.get("tools")
        if value.get("mode") not in ("auto", "required") or not isinstance(entries, list):
            raise ParamError("'tool_choice' of type 'allowed_tools' needs 'mode' ('auto' or 'required') and "
                             "'tools' (an array)", "tool_choice")
        # A hosted tool among them changes nothing: it is never offered.
        allowed = {_chosen(entry, tools, f"tool_choice.tools[{k}]") for k, entry in enumerate(entries)
                   if not isinstance(entry, dict) or entry.get("type") in ("function", "custom")}
        offered = [tool for tool in tools.tools if tool.name in allowed]
        return tool_choice(value["mode"], offered, "tool_choice", "flat"), offered
    if isinstance(kind, str):
        raise ParamError(f"'tool_choice' names a tool of type {kind!r}, which cannot run here: only function and "
                         "custom tools can be chosen", "tool_choice")
    raise ParamError("'tool_choice' must be 'none', 'auto', 'required' or an object naming a tool", "tool_choice")


def _chosen(value: Any, tools: ResponseTools, param: str) -> str:
    """The tool `value` names ({type: function | custom, name, namespace?}), as the model knows it."""
    if not isinstance(value, dict):
        raise ParamError(f"'{param}' must be an object naming a tool", param)
    name, namespace, kind = value.get("name"), value.get("namespace"), value.get("type")
    if not isinstance(name, str) or not isinstance(namespace, str | None):
        raise ParamError(f"'{param}' must name a tool: 'name' (and 'namespace') strings", param)
    known = qualified(name, namespace)
    called = tools.names.get(known)
    if called is None or called.custom != (kind == "custom"):
        what = "custom tool" if kind == "custom" else "function"
        raise ParamError(f"'{param}' names the {what} {known!r}, which is not in 'tools'", param)
    return known
