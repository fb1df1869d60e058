"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API, on the one generation path,
for the anthropic SDK and Claude Code.

A Messages request becomes the generation input (`generation_input`): `system` the system message, its
turns chat messages (edge/endpoints/message_input.py), after its `context_management` edits
(edge/endpoints/message_context.py); `tools` and `tool_choice` chat's tools (edge/endpoints/message_tools.py:
server tools are hosted tools, never offered); `stop_sequences` the stop strings; `thinking` the chat
template's `enable_thinking` and `output_config.effort` its `reasoning_effort`; `max_tokens` is cut to the
model's room rather than refused (`fit_max_tokens`: clients such as Claude Code ask 32,000 of every model).
Errors on these routes have Anthropic's shape (edge/errors.py). The answer is written by
edge/endpoints/message_output.py (`answer_shape`), its schemas declared in edge/endpoints/message_schemas.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Annotated, Any, Self

from pydantic import Field, PrivateAttr, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import UINT32_MAX, OpenAIRequest
from edge.endpoints.llm_common import TopP, stop_list
from edge.endpoints.message_context import Edit, apply_edits, context_edits
from edge.endpoints.message_input import Conversation, chat_messages, system_text
from edge.endpoints.message_output import MessageShape
from edge.endpoints.message_tools import TOOL_CHOICES, MessageTools, message_tools, tool_choice
from edge.endpoints.tools import schema_text
from edge.errors import ParamError
from edge.generation import GenerationInput, SamplingRequest, Tooling
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under their Messages names, for what the llm service refuses.
NAMES = {"stop": "stop_sequences", "chat_template_kwargs": "thinking", "response_format": "output_config.format"}
MIN_THINKING_BUDGET = 1024  # Anthropic's least `budget_tokens`
THINKING_DISPLAYS = ("summarized", "omitted", "updates")
EFFORTS = ("low", "medium", "high", "xhigh", "max")

_BLOCK = {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]}
MessagesJson = Annotated[Any, WithJsonSchema({"type": "array", "minItems": 1, "items": {
    "type": "object", "properties": {"role": {"enum": ["user", "assistant", "system"]}, "content": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]},
        "clear_at": {"enum": ["next_user_message", "never"]}}, "required": ["role", "content"]}})]
SystemJson = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]})]
ToolsJson = Annotated[Any, WithJsonSchema({"type": "array", "items": {
    "type": "object", "properties": {"type": {"type": "string"}, "name": {"type": "string"},
                                     "description": {"type": "string"}, "input_schema": {"type": "object"},
                                     "defer_loading": {"type": "boolean"}}}})]
ToolChoiceJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "type": {"enum": list(TOOL_CHOICES)}, "name": {"type": "string"}, "disable_parallel_tool_use": {"type": "boolean"}},
    "required": ["type"]})]
ThinkingJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "type": {"enum": ["enabled", "disabled", "adaptive"]}, "budget_tokens": {"type": "integer"},
    "display": {"enum": list(THINKING_DISPLAYS)}}, "required": ["type"]})]
ContextManagementJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {"edits": {
    "type": "array", "items": _BLOCK}}})]
OutputConfigJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "effort": {"enum": list(EFFORTS)}, "format": {"type": "object", "properties": {
        "type": {"const": "json_schema"}, "schema": {"type": "object"}}, "required": ["type", "schema"]}}})]


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


class Metadata(OpenAIRequest):
    user_id: str | None = None


class MessagesInput(OpenAIRequest):
    """What a generation and a token count share: the model, the conversation and how to edit it, the tools,
    thinking and the output's configuration."""

    model: str
    messages: MessagesJson
    system: SystemJson = None
    tools: ToolsJson = None
    tool_choice: ToolChoiceJson = None
    thinking: ThinkingJson = None
    context_management: ContextManagementJson = None
    output_config: OutputConfigJson = None
    _tooling: Tooling = PrivateAttr(default_factory=Tooling)  # the offered tools and tool_choice, checked
    _applied: list[dict[str, Any]] | None = PrivateAttr(default=None)  # the context edits that cleared something

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: Any) -> Conversation:
        return chat_messages(value)

    @field_validator("system")
    @classmethod
    def _system(cls, value: Any) -> str | None:
        return None if value is None else system_text(value)

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: Any) -> MessageTools | None:
        return None if value is None else message_tools(value)

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, value: Any) -> Thinking | None:
        return thinking_of(value)

    @field_validator("context_management")
    @classmethod
    def _context_management(cls, value: Any) -> list[Edit] | None:
        return None if value is None else context_edits(value)

    @field_validator("output_config")
    @classmethod
    def _output_config(cls, value: Any) -> OutputConfig | None:
        return None if value is None else output_config(value)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        return self._with_tools_and_edits()

    def _with_tools_and_edits(self) -> Self:
        """The offered tools (those the conversation loads or withdraws counted) and tool_choice over them;
        the conversation edited."""
        conversation: Conversation = self.messages
        tools: MessageTools = self.tools or MessageTools()
        self._tooling = tool_choice(self.tool_choice, tools, tools.offered(conversation.tool_changes))
        if self.context_management is not None:
            self._applied = apply_edits(conversation.messages, self.context_management)
        return self

    @property
    def tooling(self) -> Tooling:
        return self._tooling

    @property
    def hosted_tools(self) -> list[llm_pb2.HostedTool]:
        return self.tools.hosted if self.tools is not None else []

    @property
    def applied_edits(self) -> list[dict[str, Any]] | None:
        """The context edits that cleared something; None: the request asked for none."""
        return self._applied


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
        return self._with_tools_and_edits()


def _template_variables(body: MessagesInput) -> dict[str, Any]:
    thinking: Thinking | None = body.thinking
    config: OutputConfig | None = body.output_config
    variables: dict[str, Any] = {}
    if thinking is not None and thinking.enabled is not None:
        variables["enable_thinking"] = thinking.enabled
    if config is not None and config.effort is not None:
        variables["reasoning_effort"] = config.effort
    return variables


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
    config: OutputConfig | None = body.output_config
    return GenerationInput(model=body.model, messages=[*system, *conversation.messages], images=conversation.images,
                           sampling=sampling, stream=stream,
                           tooling=replace(body.tooling, guide=config.guide if config else None),
                           template_variables=_template_variables(body), hosted_tools=body.hosted_tools,
                           fit_max_tokens=isinstance(body, MessagesRequest), names=NAMES)


def answer_shape(body: MessagesRequest) -> MessageShape:
    """How the answer to `body` is written: its thinking's text shown or not, its context edits reported."""
    thinking: Thinking | None = body.thinking
    return MessageShape(thinking_shown=thinking is None or thinking.shown, applied_edits=body.applied_edits)


class CountTokensRequest(MessagesInput):
    """Anthropic's CountMessageTokens: the input of a Messages request, counted as it would be sent."""
