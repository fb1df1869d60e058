"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API, on the one generation path,
for the anthropic SDK and Claude Code.

A Messages request becomes the generation input (`generation_input`): `system` the system message, its
turns chat messages (edge/endpoints/message_input.py), after its `context_management` edits
(edge/endpoints/message_context.py); `tools` and `tool_choice` chat's tools (edge/endpoints/message_tools.py:
server tools are hosted tools, never offered); `stop_sequences` the stop strings; `thinking` the chat
template's `enable_thinking` and `output_config.effort` its `reasoning_effort`; `max_tokens` is cut to the
model's room rather than refused (`fit_max_tokens`: clients such as Claude Code ask 32,000 of every model).
Errors on these routes have Anthropic's shape (edge/errors.py); the schemas are declared in
edge/endpoints/message_schemas.py.

The answer (`answer_shape`) is collected into one Message (`MessageShape.response`) or streamed as
Anthropic's events (`MessageEvents`): `message_start`, `ping`, per content block `content_block_start`, its
deltas (`thinking_delta`, `text_delta`, `input_json_delta`) and `content_block_stop`, then `message_delta`
(the stop reason, the usage and the context edits applied) and `message_stop`; a token count has its own.
The usage counts as Anthropic's does: `input_tokens` are the prompt tokens the backend did not take from its
cache, `cache_read_input_tokens` those it did (`Usage.cached_tokens`; known when the generation ends, so 0 in
`message_start`), `cache_creation_input_tokens` 0.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Iterable, Iterator
from dataclasses import replace
from typing import Annotated, Any, Self

import orjson
from pydantic import Field, PrivateAttr, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import UINT32_MAX, OpenAIRequest
from edge.endpoints.llm_common import CacheSalt, Collected, TopP, stop_list
from edge.endpoints.message_context import Edit, apply_edits, context_edits
from edge.endpoints.message_input import (
    EFFORTS,
    THINKING_DISPLAYS,
    Conversation,
    OutputConfig,
    Thinking,
    chat_messages,
    output_config,
    system_text,
    thinking_of,
)
from edge.endpoints.message_tools import TOOL_CHOICES, MessageTools, message_tools, tool_choice
from edge.errors import ParamError
from edge.generation import Affinity, GenerationInput, SamplingRequest, Tooling
from edge.sse import EventStream, sse_response
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under their Messages names, for what the llm service refuses.
NAMES = {"stop": "stop_sequences", "chat_template_kwargs": "thinking", "response_format": "output_config.format"}

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
        if self.tools is not None or self.tool_choice is not None:  # else no tool, and nothing to choose
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
    cache_salt: CacheSalt | None = None  # vLLM's, as on its OpenAI endpoints

    @property
    def affinity(self) -> Affinity:
        return Affinity(self.metadata.user_id if self.metadata else None, self.cache_salt)

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
                           fit_max_tokens=isinstance(body, MessagesRequest), names=NAMES,
                           affinity=body.affinity if isinstance(body, MessagesRequest) else Affinity())


def answer_shape(body: MessagesRequest) -> MessageShape:
    """How the answer to `body` is written: its thinking's text shown or not, its context edits reported."""
    thinking: Thinking | None = body.thinking
    return MessageShape(thinking_shown=thinking is None or thinking.shown, applied_edits=body.applied_edits)


class CountTokensRequest(MessagesInput):
    """Anthropic's CountMessageTokens: the input of a Messages request, counted as it would be sent."""


STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop(finish_reason: str, stop_string: str) -> dict[str, Any]:
    if stop_string:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop_string}
    return {"stop_reason": STOP_REASONS.get(finish_reason, "end_turn"), "stop_sequence": None}


def _usage(usage: common_pb2.Usage) -> dict[str, int]:
    return {"input_tokens": usage.prompt_tokens - usage.cached_tokens, "output_tokens": usage.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": usage.cached_tokens}


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (a model that wrote no JSON object gives {})."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}  # no signature: nothing here is signed


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, call_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": call_input}


class MessageShape:
    """A whole Message (the collecting side of the generation path), and its stream (`events`): the thinking's
    text shown unless `thinking_shown` is False (its blocks empty), the context edits applied
    (`applied_edits`) reported unless None (the request asked for none)."""

    object = "message"
    prefix = "msg_"  # Anthropic's ids: msg_...

    def __init__(self, thinking_shown: bool = True, applied_edits: list[dict[str, Any]] | None = None) -> None:
        self.thinking_shown = thinking_shown
        self.context_management = None if applied_edits is None else {"applied_edits": applied_edits}

    def message(self, head: dict[str, Any], content: list[dict[str, Any]], stop: dict[str, Any],
                usage: dict[str, int]) -> dict[str, Any]:
        return {"id": head["id"], "type": "message", "role": "assistant", "model": head["model"], "content": content,
                **stop, "usage": usage}

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        choice = choices[0]
        content = [thinking_block(choice.reasoning if self.thinking_shown else "")] if choice.reasoning else []
        if choice.text:
            content.append(text_block(choice.text))
        content += [tool_use_block(call["id"], call["name"], _arguments(call["arguments"]))
                    for call in choice.tool_calls]
        message = self.message(head, content, _stop(choice.finish_reason, choice.stop_string), _usage(usage))
        if self.context_management is not None:
            message["context_management"] = self.context_management
        return message

    def events(self, head: dict[str, Any]) -> MessageEvents:
        return MessageEvents(self, head)


class MessageEvents:
    """Anthropic's stream: message_start and a ping; each content block opened (content_block_start) with
    the first piece of its kind (thinking, text, or a new tool call), its deltas, closed
    (content_block_stop) when another begins or the answer ends; then message_delta and message_stop."""

    def __init__(self, shape: MessageShape, head: dict[str, Any]) -> None:
        self.shape = shape
        self.head = head
        self.blocks = 0  # blocks opened so far; the last is open while `open` is set
        self.open: str | None = None  # "thinking", "text", or the index of the tool call being streamed
        self.stop: dict[str, Any] = _stop("stop", "")
        self.input_tokens = 0

    def _close(self) -> Iterator[bytes]:
        if self.open is not None:
            yield _event({"type": "content_block_stop", "index": self.blocks - 1})
            self.open = None

    def _block(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        """Open a block of `kind` unless one is open."""
        if self.open != kind:
            yield from self._close()
            yield _event({"type": "content_block_start", "index": self.blocks, "content_block": block})
            self.blocks += 1
            self.open = kind

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        self.input_tokens = accepted.prompt_tokens
        message = self.shape.message(self.head, [], {"stop_reason": None, "stop_sequence": None},
                                     _usage(common_pb2.Usage(prompt_tokens=accepted.prompt_tokens)))
        yield _event({"type": "message_start", "message": message})
        yield _event({"type": "ping"})

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if delta.reasoning:
            yield from self._block("thinking", thinking_block(""))
            if self.shape.thinking_shown:
                yield self._delta({"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.text:
            yield from self._block("text", text_block(""))
            yield self._delta({"type": "text_delta", "text": delta.text})
        for piece in delta.tool_calls:
            yield from self._block(f"call {piece.index}", tool_use_block(piece.id, piece.name, {}))
            if piece.arguments:
                yield self._delta({"type": "input_json_delta", "partial_json": piece.arguments})

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.stop = _stop(finish_reason, stop_string)
        yield from self._close()

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        closing = {"type": "message_delta", "delta": self.stop, "usage": _usage(usage)}
        if self.shape.context_management is not None:
            closing["context_management"] = self.shape.context_management
        yield _event(closing)
        yield _event({"type": "message_stop"})


def event_stream(events: AsyncGenerator[bytes, None], keepalive_s: float) -> EventStream:
    """The stream's events as Server-Sent Events: Anthropic's streams end without `[DONE]`."""
    return sse_response(events, keepalive_s, done=b"")


def token_count(tokens: int) -> dict[str, int]:
    return {"input_tokens": tokens}
