"""The Messages API's answers as /openapi.json declares them (Anthropic's schemas, restricted to what this
server sends): the Message, each event of its stream, the token count and Anthropic's error body."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, RootModel

from edge.endpoints.common import ResponseModel


class TextBlock(ResponseModel):
    type: Literal["text"]
    text: str


class ThinkingBlock(ResponseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlock(ResponseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = Annotated[TextBlock | ThinkingBlock | ToolUseBlock, Field(discriminator="type")]


class MessageUsage(ResponseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class ClearedThinking(ResponseModel):
    type: Literal["clear_thinking_20251015"]
    cleared_thinking_turns: int
    cleared_input_tokens: int  # 0: not counted


class ClearedToolUses(ResponseModel):
    type: Literal["clear_tool_uses_20250919"]
    cleared_tool_uses: int
    cleared_input_tokens: int  # 0: not counted


class ContextManagement(ResponseModel):
    """The context edits the request asked for that cleared something."""

    applied_edits: list[Annotated[ClearedThinking | ClearedToolUses, Field(discriminator="type")]]


class Message(ResponseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessageUsage
    context_management: ContextManagement | None = None  # when the request had `context_management`


class MessageStartEvent(ResponseModel):
    type: Literal["message_start"]
    message: Message


class PingEvent(ResponseModel):
    type: Literal["ping"]


class ContentBlockStartEvent(ResponseModel):
    type: Literal["content_block_start"]
    index: int
    content_block: ContentBlock


class TextDelta(ResponseModel):
    type: Literal["text_delta"]
    text: str


class ThinkingDelta(ResponseModel):
    type: Literal["thinking_delta"]
    thinking: str


class InputJsonDelta(ResponseModel):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDeltaEvent(ResponseModel):
    type: Literal["content_block_delta"]
    index: int
    delta: Annotated[TextDelta | ThinkingDelta | InputJsonDelta, Field(discriminator="type")]


class ContentBlockStopEvent(ResponseModel):
    type: Literal["content_block_stop"]
    index: int


class StopDelta(ResponseModel):
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None


class MessageDeltaEvent(ResponseModel):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: MessageUsage
    context_management: ContextManagement | None = None  # when the request had `context_management`


class MessageStopEvent(ResponseModel):
    type: Literal["message_stop"]


class MessageStreamEvent(RootModel[Annotated[
        MessageStartEvent | PingEvent | ContentBlockStartEvent | ContentBlockDeltaEvent | ContentBlockStopEvent
        | MessageDeltaEvent | MessageStopEvent, Field(discriminator="type")]]):
    """One event of a stream (`event:` is its `type`)."""


class TokenCount(ResponseModel):
    input_tokens: int


class AnthropicErrorObject(ResponseModel):
    type: str
    message: str


class AnthropicError(ResponseModel):
    """Anthropic's error body, which every error of these routes has."""

    type: Literal["error"]
    error: AnthropicErrorObject
