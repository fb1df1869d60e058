"""The Responses API's answers as /openapi.json declares them (OpenAI's Response and ResponseStreamEvent,
restricted to what this server sends)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, RootModel

from edge.endpoints.chat import ReasoningEffort
from edge.endpoints.common import ResponseModel


class OutputText(ResponseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class OutputMessage(ResponseModel):
    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class ReasoningText(ResponseModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(ResponseModel):
    id: str
    type: Literal["reasoning"]
    status: Literal["in_progress", "completed", "incomplete"]
    summary: list[Any]  # always empty: no summaries are written
    content: list[ReasoningText]
    # With include ["reasoning.encrypted_content"], once whole: the thinking, opaque (not secret).
    encrypted_content: str | None = None


class ReasoningConfig(ResponseModel):
    effort: ReasoningEffort | None
    summary: Literal["auto", "concise", "detailed"] | None


class FunctionCallItem(ResponseModel):
    id: str
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str
    namespace: str | None = None  # a namespace's function: its namespace (`name` is the function's own)


class CustomToolCallItem(ResponseModel):
    id: str
    type: Literal["custom_tool_call"]
    call_id: str
    name: str
    input: str  # the raw input, as the tool's format (its grammar) has it
    namespace: str | None = None


OutputItem = ReasoningItem | OutputMessage | FunctionCallItem | CustomToolCallItem


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class ResponseError(ResponseModel):
    code: Literal["server_error", "rate_limit_exceeded"]
    message: str


class Response(ResponseModel):
    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None = None
    status: Literal["completed", "incomplete", "in_progress", "failed"]
    error: ResponseError | None  # a failed Response's
    incomplete_details: dict[str, str] | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    tool_choice: Any
    tools: list[Any]
    truncation: Literal["auto", "disabled"]
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str]
    # Echoed when the request has them.
    max_tool_calls: int | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"] | None = None


class _Event(ResponseModel):
    sequence_number: int


class ResponseLifecycleEvent(_Event):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete",
                  "response.failed"]
    response: Response


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class ReasoningTextDeltaEvent(_Event):
    type: Literal["response.reasoning_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDoneEvent(_Event):
    type: Literal["response.reasoning_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str


class OutputTextDeltaEvent(_Event):
    type: Literal["response.output_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class OutputTextDoneEvent(_Event):
    type: Literal["response.output_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    name: str
    arguments: str


class CustomToolInputDeltaEvent(_Event):
    type: Literal["response.custom_tool_call_input.delta"]
    item_id: str
    output_index: int
    delta: str


class CustomToolInputDoneEvent(_Event):
    type: Literal["response.custom_tool_call_input.done"]
    item_id: str
    output_index: int
    input: str


class ResponseStreamEvent(RootModel[Annotated[
        ResponseLifecycleEvent | OutputItemEvent | ContentPartEvent | OutputTextDeltaEvent | OutputTextDoneEvent
        | ArgumentsDeltaEvent | ArgumentsDoneEvent | CustomToolInputDeltaEvent | CustomToolInputDoneEvent
        | ReasoningTextDeltaEvent | ReasoningTextDoneEvent,
        Field(discriminator="type")]]):
    """One event of a stream (`event:` is its `type`): the types of OpenAI's ResponseStreamEvent that
    `ResponseEvents` writes."""
