"""Structured output and tools: chat's `response_format`, `tools`, `tool_choice`, and the legacy
`functions` / `function_call` (mapped onto tools), with their rules and their part of the generation
input (Responses' `text.format` and flat function tools, and Anthropic's tools, go through the same rules);
and the `tool_calls` / `function_call` of answers and chunks. The rules run in the request models'
validators, which keep what they checked as the request's `Tooling` (edge/generation.py).

The edge checks shapes and that every schema is a JSON Schema (a 400 naming the parameter); the llm service
decides what the model's backend can enforce (guided decoding) and parses the model's tool calls.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import orjson
from jsonschema import SchemaError
from jsonschema.validators import Draft202012Validator, validator_for
from pydantic import WithJsonSchema

from edge.errors import ParamError
from tritongate.llm.v1 import llm_pb2

MAX_TOOLS = 128  # OpenAI's limit
MAX_SCHEMA_BYTES = 64 * 1024  # of one schema, as compact JSON: grammar compilation grows with it
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # function and json_schema names, as OpenAI's
TOOL_CHOICES = ("none", "auto", "required")
ToolLayout = Literal["nested", "functions", "flat"]  # chat's tools, its legacy functions, Responses'
# What the rules below accept of chat's, as /openapi.json declares it.
FUNCTION_SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                                   "parameters": {"type": "object"}, "strict": {"type": "boolean"}},
                   "required": ["name"]}
_NAMED = {"type": "object", "properties": {"type": {"const": "function"}, "function": {
    "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}},
          "required": ["type", "function"]}
CALL_SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}, "type": {"const": "function"}, "function": {
    "type": "object", "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
    "required": ["name", "arguments"]}}, "required": ["id", "type", "function"]}
ResponseFormat = Annotated[Any, WithJsonSchema({"anyOf": [
    {"type": "object", "properties": {"type": {"enum": ["text", "json_object"]}}, "required": ["type"]},
    {"type": "object", "properties": {"type": {"const": "json_schema"}, "json_schema": {
        "type": "object", "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                         "schema": {"type": "object"}, "strict": {"type": "boolean"}},
        "required": ["name", "schema"]}}, "required": ["type", "json_schema"]},
    {"type": "null"}]})]
Tools = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "array", "maxItems": MAX_TOOLS, "items": {
    "type": "object", "properties": {"type": {"const": "function"}, "function": FUNCTION_SCHEMA},
    "required": ["type", "function"]}}, {"type": "null"}]})]
ToolChoiceJson = Annotated[Any, WithJsonSchema({"anyOf": [{"enum": ["none", "auto", "required"]}, _NAMED,
                                                          {"type": "null"}]})]


def schema_text(schema: Any, param: str, what: str) -> str:
    """A JSON Schema object as compact JSON text, within MAX_SCHEMA_BYTES and valid against its metaschema."""
    if not isinstance(schema, dict):
        raise ParamError(f"{what} must be a JSON Schema object", param)
    text = orjson.dumps(schema)
    if len(text) > MAX_SCHEMA_BYTES:
        raise ParamError(f"{what} is {len(text)} bytes of JSON; at most {MAX_SCHEMA_BYTES} are allowed", param)
    try:
        validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        raise ParamError(f"{what} is not a valid JSON Schema: {exc.message}" + (f" (at {where})" if where else ""),
                         param) from None
    return text.decode()


def response_guide(value: Any, param: str = "response_format", nested: str | None = "json_schema"
                   ) -> llm_pb2.Guide | None:
    """An output format: text (None), json_object, or json_schema with its `schema` (and `strict`). Chat's
    `response_format` holds the schema's fields under `json_schema`; Responses' `text.format` (`nested`
    None) beside its `type`."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return llm_pb2.Guide(json_object=True)
    if kind != "json_schema":
        raise ParamError(f"'{param}' must be an object with type 'text', 'json_object' or 'json_schema'", param)
    spec = value.get(nested) if nested else value
    where = f"{param}.{nested}" if nested else param
    if not isinstance(spec, dict):
        raise ParamError(f"'{where}' must be an object with 'name' and 'schema'", param)
    if not isinstance(spec.get("name"), str) or not NAME.match(spec["name"]):
        raise ParamError(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'", param)
    if "schema" not in spec:
        raise ParamError(f"'{where}' has no 'schema'", param)
    if not isinstance(spec.get("strict", False), bool | None):
        raise ParamError(f"'{where}.strict' must be a boolean", param)
    return llm_pb2.Guide(json_schema=schema_text(spec["schema"], param, f"'{where}.schema'"))


def function_tool(function: Any, where: str, param: str, schema: str = "parameters") -> llm_pb2.Tool:
    """One function definition ({name, description, parameters, strict}; Anthropic's calls `parameters`
    `input_schema`)."""
    if not isinstance(function, dict):
        raise ParamError(f"'{where}' must be an object with a 'name'", param)
    name = function.get("name")
    if not isinstance(name, str) or not NAME.match(name):
        raise ParamError(f"'{where}.name' must be 1 to 64 letters, digits, '_' or '-'", param)
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise ParamError(f"'{where}.description' must be a string", param)
    strict = function.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ParamError(f"'{where}.strict' must be a boolean", param)
    parameters = function.get(schema)
    text = "" if parameters is None else schema_text(parameters, param, f"'{where}.{schema}'")
    if parameters is not None and parameters.get("type", "object") != "object":
        raise ParamError(f"'{where}.{schema}' must be a JSON Schema of type 'object'", param)
    return llm_pb2.Tool(name=name, description=description or "", parameters=text, strict=bool(strict))


def _function(entry: Any, i: int, param: str, layout: ToolLayout) -> tuple[Any, str]:
    """A tool entry's function definition, and where it is in the request."""
    if layout == "functions":
        return entry, f"{param}[{i}]"
    kind = entry.get("type") if isinstance(entry, dict) else None
    if kind != "function":
        raise ParamError(f"'{param}[{i}]' must be an object with type 'function' and a 'function'", param)
    return entry.get("function"), f"{param}[{i}].function"


def tool_list(value: Any, param: str, layout: ToolLayout = "nested") -> list[llm_pb2.Tool]:
    """Chat's function tools, names unique: its `tools` ([{type: function, function}]) or the legacy
    `functions` ([function])."""
    if not isinstance(value, list):
        raise ParamError(f"'{param}' must be an array", param)
    if len(value) > MAX_TOOLS:
        raise ParamError(f"'{param}' may hold at most {MAX_TOOLS} functions; got {len(value)}", param)
    tools = [function_tool(*_function(entry, i, param, layout), param=param) for i, entry in enumerate(value)]
    names = [tool.name for tool in tools]
    duplicate = next((name for name in names if names.count(name) > 1), None)
    if duplicate:
        raise ParamError(f"'{param}' names the function {duplicate!r} more than once", param)
    return tools


def tool_choice(value: Any, tools: list[llm_pb2.Tool], param: str, layout: ToolLayout = "nested"
                ) -> llm_pb2.ToolChoice:
    """`tool_choice` ("none", "auto", "required", or naming a function: {type: function, function: {name}},
    Responses' {type: function, name}), or legacy `function_call` ("none", "auto", {name}); a named
    function must be one of the tools."""
    legacy = layout == "functions"
    if value is None:
        return llm_pb2.ToolChoice(mode="auto" if tools else "none")
    if isinstance(value, str):
        if value not in TOOL_CHOICES or (legacy and value == "required"):
            raise ParamError(f"'{param}' must be 'none', 'auto'{'' if legacy else ', required'} "
                             "or an object naming a function", param)
        if value == "required" and not tools:
            raise ParamError(f"'{param}' 'required' needs 'tools'", param)
        return llm_pb2.ToolChoice(mode=value)
    named = value.get("function") if isinstance(value, dict) and layout == "nested" else value
    name = named.get("name") if isinstance(named, dict) else None
    if not isinstance(name, str) or (not legacy and value.get("type") != "function"):
        raise ParamError(f"'{param}' must be 'none', 'auto' or an object naming a function", param)
    if name not in {tool.name for tool in tools}:
        raise ParamError(f"'{param}' names the function {name!r}, which is not in "
                         f"'{'functions' if legacy else 'tools'}'", param)
    return llm_pb2.ToolChoice(mode="function", function=name)


def message_tool_calls(value: Any) -> list[llm_pb2.ToolCall]:
    """An assistant message's `tool_calls` (ids, names, arguments as JSON text)."""
    if not isinstance(value, list):
        raise ParamError("'tool_calls' must be an array of tool calls")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or \
                not isinstance(function.get("arguments", ""), str) or not isinstance(call.get("id", ""), str):
            raise ParamError(f"tool call {i} must be an object with an 'id' and a 'function' with 'name' and "
                             "'arguments' (a JSON string)")
        calls.append(llm_pb2.ToolCall(id=call.get("id") or "", name=function["name"],
                                      arguments=function.get("arguments") or "{}"))
    return calls


def call_json(call: dict[str, str], legacy: bool) -> dict[str, Any]:
    """One collected call as a message's `tool_calls` entry, or its legacy `function_call`."""
    function = {"name": call["name"], "arguments": call["arguments"]}
    return function if legacy else {"id": call["id"], "type": "function", "function": function}


def delta_json(piece: llm_pb2.ToolCallDelta, legacy: bool) -> dict[str, Any]:
    """One piece of a call in a stream chunk: the id, type and name first, then arguments."""
    function = {"name": piece.name, "arguments": piece.arguments} if piece.name else {"arguments": piece.arguments}
    if legacy:
        return function
    if piece.id:
        return {"index": piece.index, "id": piece.id, "type": "function", "function": function}
    return {"index": piece.index, "function": function}
