"""What a chat's tools change in a generation: the messages and tools the chat template sees (an agent's
earlier calls and the tools' results replayed as transformers' `apply_chat_template(tools=...)` gives
them), the guide that forces a call (`tool_choice` `required` or a named tool, enforced by guided
decoding), and the parser that finds calls in the model's text (`tool_choice` `auto`). The tools' JSON
Schemas are parsed once per request (`ChatTools`); the template, the forced call and the named function all
read that. Custom tools are shown to the model as functions of one string parameter, `input`, and their
calls come back with the input itself as their arguments (services/llm/custom_tools.py).

A template that does not render `tools` gets the Hermes format, which small instruction models follow best:
the tools described in the system message, calls as `<tool_call>` JSON, results as `<tool_response>`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from services.llm.backends import Guide
from services.llm.custom_tools import INPUT_SCHEMA, CustomCalls, RawParser
from services.llm.params import GenerationPolicy, guide_of, guided
from services.llm.toolcalls import JsonListParser, NamedParser, ParserName, ToolCallParser, make_parser
from tritongate.llm.v1 import llm_pb2

OBJECT = {"type": "object"}
HERMES_SYSTEM = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}}\n</tool_call>"
)


def _function(tool: llm_pb2.Tool) -> dict[str, Any]:
    """A tool as OpenAI's function object; a custom tool as a function of one string, `input`."""
    declared = json.loads(tool.parameters) if tool.parameters else dict(OBJECT)
    parameters = dict(INPUT_SCHEMA) if tool.custom else declared
    described = {"description": tool.description} if tool.description else {}
    return {"type": "function", "function": {"name": tool.name, **described, "parameters": parameters}}


@dataclass(frozen=True)
class ChatTools:
    """A chat's tools as OpenAI's objects (`{"type": "function", "function": {"name", "description",
    "parameters"}}`), each one's parameters parsed once per request: the chat template sees these objects
    (or their Hermes description), and the forced call's schema is built from them. `custom` holds the
    custom tools, by name, with their grammars (None: any text). Empty when the chat has no tools or
    `tool_choice` is `none`: the model is then told of none."""

    objects: tuple[dict[str, Any], ...] = ()
    custom: Mapping[str, Guide | None] = field(default_factory=dict)

    @classmethod
    def of(cls, chat: llm_pb2.Chat) -> ChatTools:
        if not chat.tools or chat.tool_choice.mode == "none":
            return cls()
        return cls(tuple(_function(tool) for tool in chat.tools),
                   {tool.name: guide_of(tool.grammar) for tool in chat.tools if tool.custom})

    def parameters(self, name: str) -> dict[str, Any]:
        """The parameters' schema of the tool `name` (one the edge checked the chat has)."""
        return next(tool["function"]["parameters"] for tool in self.objects if tool["function"]["name"] == name)

    def unwrapping(self, parser: Callable[[], ToolCallParser]) -> Callable[[], ToolCallParser]:
        """`parser`, with the calls of the custom tools unwrapped (their input as their arguments)."""
        custom = frozenset(self.custom)
        return (lambda: CustomCalls(parser(), custom)) if custom else parser


NO_TOOLS = ChatTools()


@dataclass(frozen=True)
class ToolPlan:
    """How one request uses its tools: a parser per choice (None: plain text), whether the turn is a forced
    call (`forced`: the request's `response_format` is for the answer after it), what guided decoding holds
    the call to (None: nothing) and the parameter that asked for it."""

    parser: Callable[[], ToolCallParser] | None = None
    guide: Guide | None = None
    param: str = ""
    forced: bool = False

    @classmethod
    def of(cls, chat: llm_pb2.Chat, tools: ChatTools, family: ParserName, policy: GenerationPolicy) -> ToolPlan:
        """The plan for `chat`, whose tools are `tools`; a call forced by guided decoding on a backend without
        it is refused."""
        choice = chat.tool_choice
        parallel = not chat.HasField("parallel_tool_calls") or chat.parallel_tool_calls
        if not tools.objects:
            return cls()
        if choice.function:
            return cls.named(choice.function, tools, policy)
        if choice.mode == "required":
            guided(policy, "tool_choice", "'required'")
            return cls(tools.unwrapping(lambda: JsonListParser(parallel)),
                       Guide("json_schema", forced_calls_schema(tools, parallel)), "tool_choice", forced=True)
        return cls(tools.unwrapping(lambda: make_parser(family, parallel)))

    @classmethod
    def named(cls, name: str, tools: ChatTools, policy: GenerationPolicy) -> ToolPlan:
        """A call of the tool `name`: a function's arguments held to its parameters' schema; a custom tool's
        input held to its grammar, if it has one (without one, any text: no guided decoding is needed)."""
        if name not in tools.custom:
            guided(policy, "tool_choice", "naming a function")
            return cls(lambda: NamedParser(name), Guide("json_schema", json.dumps(tools.parameters(name))),
                       "tool_choice", forced=True)
        grammar = tools.custom[name]
        if grammar is not None:
            guided(policy, "tool_choice", "naming a custom tool with a grammar")
        return cls(lambda: RawParser(name), grammar, "tools" if grammar else "tool_choice", forced=True)


def forced_calls_schema(tools: ChatTools, parallel: bool) -> str:
    """`tool_choice: required`: an array of at least one call of any tool, with that tool's arguments (a
    custom tool's: `{"input": "..."}`, any text)."""
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"type": "string", "enum": [tool["function"]["name"]]},
                             "arguments": tool["function"]["parameters"]}}
             for tool in tools.objects]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if not parallel:
        schema["maxItems"] = 1
    return json.dumps(schema)


def _arguments(call: llm_pb2.ToolCall) -> Any:
    """A call's arguments as the template expects them: the object (text that is not JSON stays text); a
    custom tool's call, `{"input": <its input>}`."""
    if call.custom:
        return {"input": call.arguments}
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments


def template_messages(chat: llm_pb2.Chat, native: bool, images: bool = False, tools: ChatTools = NO_TOOLS
                      ) -> list[dict[str, Any]]:
    """The messages as a template sees them. `native`: the template renders tools and tool messages itself;
    else they are written in the Hermes format, `tools` described in the system message. `images`: the
    template places images, so a message with images has transformers' content parts,
    `[{"type": "image"}, ..., {"type": "text", "text": ...}]`."""
    messages: list[dict[str, Any]] = []
    for m in chat.messages:
        content: Any = m.content
        if images and m.images:
            content = [*({"type": "image"} for _ in m.images), {"type": "text", "text": m.content}]
        message: dict[str, Any] = {"role": m.role, "content": content, **({"name": m.name} if m.name else {})}
        if m.reasoning:  # as vLLM gives it to templates that show earlier thinking (Qwen3's)
            message["reasoning_content"] = m.reasoning
        calls: list[dict[str, Any]] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c)}}
            for c in m.tool_calls]
        if native:
            if calls:
                message["tool_calls"] = calls
            if m.role == "tool":
                message["tool_call_id"] = m.tool_call_id
        elif m.role == "tool":
            message = {"role": "user", "content": f"<tool_response>\n{m.content}\n</tool_response>"}
        elif calls:
            written = "\n".join("<tool_call>\n" + json.dumps({"name": c["function"]["name"],
                                                             "arguments": c["function"]["arguments"]}) +
                                "\n</tool_call>" for c in calls)
            message["content"] = f"{m.content}\n{written}" if m.content else written
        messages.append(message)
    if not native and tools.objects:
        described = HERMES_SYSTEM.format(tools="\n".join(json.dumps(tool) for tool in tools.objects))
        if messages and messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{described}"}
        else:
            messages.insert(0, {"role": "system", "content": described})
    return messages
