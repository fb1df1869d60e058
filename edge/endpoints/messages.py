"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API, on the one generation path,
for the anthropic SDK and Claude Code.

A Messages request becomes the generation input (`generation_input`): `system` the system message, its
turns chat messages (edge/endpoints/message_input.py), `tools` ({name, description, input_schema}) and
`tool_choice` (`auto`, `any`, `tool`, `none`) chat's tools under the rules of edge/endpoints/tools.py,
`stop_sequences` the stop strings, `thinking` the chat template's `enable_thinking`. Errors on these
routes have Anthropic's shape (edge/errors.py). The answer is written by edge/endpoints/message_output.py,
its schemas declared in edge/endpoints/message_schemas.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import Field, PrivateAttr, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import UINT32_MAX, OpenAIRequest
from edge.endpoints.llm_common import TopP, stop_list
from edge.endpoints.message_input import Conversation, chat_messages, system_text
from edge.endpoints.tools import Tooling, tool_list
from edge.errors import ParamError
from edge.generation import GenerationInput, SamplingRequest
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under their Messages names, for what the llm service refuses.
NAMES = {"stop": "stop_sequences", "chat_template_kwargs": "thinking"}
TOOL_CHOICES = ("auto", "any", "tool", "none")
MIN_THINKING_BUDGET = 1024  # Anthropic's least `budget_tokens`

_BLOCK = {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]}
MessagesJson = Annotated[Any, WithJsonSchema({"type": "array", "minItems": 1, "items": {
    "type": "object", "properties": {"role": {"enum": ["user", "assistant"]}, "content": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]}}, "required": ["role", "content"]}})]
SystemJson = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]})]
ToolsJson = Annotated[Any, WithJsonSchema({"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                     "input_schema": {"type": "object"}}, "required": ["name", "input_schema"]}})]
ToolChoiceJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "type": {"enum": list(TOOL_CHOICES)}, "name": {"type": "string"}, "disable_parallel_tool_use": {"type": "boolean"}},
    "required": ["type"]})]
ThinkingJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "type": {"enum": ["enabled", "disabled"]}, "budget_tokens": {"type": "integer"}}, "required": ["type"]})]


def tool_choice(value: Any, tools: list[llm_pb2.Tool]) -> tuple[llm_pb2.ToolChoice, bool | None]:
    """`tool_choice` ({type: auto | any | tool (with `name`) | none, disable_parallel_tool_use}) as chat's
    choice, and whether calls may be parallel (None: the default)."""
    if value is None:
        return llm_pb2.ToolChoice(mode="auto" if tools else "none"), None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in TOOL_CHOICES:
        raise ParamError("'tool_choice' must be an object with type 'auto', 'any', 'tool' or 'none'", "tool_choice")
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ParamError("'tool_choice.disable_parallel_tool_use' must be a boolean",
                         "tool_choice.disable_parallel_tool_use")
    parallel = None if parallel is None else not parallel
    if kind in ("any", "tool") and not tools:
        raise ParamError(f"'tool_choice' of type {kind!r} needs 'tools'", "tool_choice")
    if kind == "tool":
        name = value.get("name")
        if name not in {tool.name for tool in tools}:
            raise ParamError(f"'tool_choice.name' names the tool {name!r}, which is not in 'tools'", "tool_choice.name")
        return llm_pb2.ToolChoice(mode="function", function=name), parallel
    return llm_pb2.ToolChoice(mode="required" if kind == "any" else str(kind)), parallel


@dataclass(frozen=True)
class Thinking:
    """`thinking`, checked: the chat template's `enable_thinking`, and the budget it was given."""

    enabled: bool
    budget_tokens: int = 0


def thinking_of(value: Any) -> Thinking | None:
    """`thinking`: {type: enabled, budget_tokens} or {type: disabled}."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return Thinking(enabled=False)
    if kind != "enabled":
        raise ParamError("'thinking' must be an object with type 'enabled' (and 'budget_tokens') or 'disabled'",
                         "thinking")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        raise ParamError(f"'thinking.budget_tokens' must be an integer of at least {MIN_THINKING_BUDGET}",
                         "thinking.budget_tokens")
    return Thinking(enabled=True, budget_tokens=budget)


class Metadata(OpenAIRequest):
    user_id: str | None = None


class MessagesInput(OpenAIRequest):
    """What a generation and a token count share: the model, the conversation, the tools, thinking."""

    model: str
    messages: MessagesJson
    system: SystemJson = None
    tools: ToolsJson = None
    tool_choice: ToolChoiceJson = None
    thinking: ThinkingJson = None
    _tooling: Tooling = PrivateAttr(default_factory=Tooling)  # tools and tool_choice, checked

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: Any) -> Conversation:
        return chat_messages(value)

    @field_validator("system")
    @classmethod
    def _system(cls, value: Any) -> str | None:
        return None if value is None else system_text(value)

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, value: Any) -> Thinking | None:
        return thinking_of(value)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        return self._with_tools()

    def _with_tools(self) -> Self:
        tools = tool_list(self.tools, "tools", "anthropic") if self.tools is not None else []
        self._tooling = Tooling(tools, *tool_choice(self.tool_choice, tools))
        return self

    @property
    def tooling(self) -> Tooling:
        return self._tooling


class MessagesRequest(MessagesInput):
    """Anthropic's CreateMessage (what this server reads of it; the rest is ignored, as elsewhere)."""

    max_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)]
    stop_sequences: Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}})] = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0, le=UINT32_MAX)] | None = None
    stream: bool | None = False
    metadata: Metadata | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop_sequences(cls, value: Any) -> list[str] | None:
        if value is not None and not isinstance(value, list):
            raise ParamError("'stop_sequences' must be an array of strings", "stop_sequences")
        return None if value is None else stop_list(value, "stop_sequences")

    @model_validator(mode="after")
    def _rules(self) -> Self:  # in place of MessagesInput's: the budget is checked before the tools
        checked: Thinking | None = self.thinking
        if checked is not None and checked.enabled and checked.budget_tokens >= self.max_tokens:
            raise ParamError("'thinking.budget_tokens' must be less than 'max_tokens'", "thinking.budget_tokens")
        return self._with_tools()


def generation_input(body: MessagesInput) -> GenerationInput:
    """The generation that answers `body` (a token count: the same input, never sent to generate)."""
    system = [llm_pb2.ChatMessage(role="system", content=body.system)] if body.system else []
    sampling = SamplingRequest()
    stream = False
    if isinstance(body, MessagesRequest):
        sampling = SamplingRequest(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                                   top_k=body.top_k, stop=body.stop_sequences or ())
        stream = bool(body.stream)
    conversation: Conversation = body.messages
    thinking: Thinking | None = body.thinking
    tooling = body.tooling
    return GenerationInput(model=body.model, messages=[*system, *conversation.messages], images=conversation.images,
                           sampling=sampling, stream=stream, tools=tooling.tools, tool_choice=tooling.choice,
                           parallel_tool_calls=tooling.parallel, names=NAMES,
                           template_variables={} if thinking is None else {"enable_thinking": thinking.enabled})


class CountTokensRequest(MessagesInput):
    """Anthropic's CountMessageTokens: the input of a Messages request, counted as it would be sent."""
