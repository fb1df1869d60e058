"""POST /v1/chat/completions: the request in the order of OpenAI's CreateChatCompletionRequest (our
extensions last) with its rules, its generation input, and its response and stream chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import (
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from edge.endpoints.common import UINT32_MAX, Head, OpenAIRequest, ResponseModel, Usage, usage_object
from edge.endpoints.llm_common import Collected, GenerationRequest
from edge.endpoints.tools import (
    CALL_SCHEMA,
    FUNCTION_SCHEMA,
    MAX_TOOLS,
    ResponseFormat,
    ToolChoiceJson,
    Tools,
    call_json,
    delta_json,
    message_tool_calls,
    response_guide,
    tool_choice,
    tool_list,
)
from edge.errors import ParamError
from edge.generation import GenerationInput, Tooling
from edge.images import PendingImage, chat_part_url
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# OpenAI's ReasoningEffort (openapi.yaml); the chat template decides what each means, if anything.
ReasoningEffort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
ReasoningField = Literal["reasoning_content", "reasoning", "both"]
REASONING_FIELDS: dict[str, tuple[str, ...]] = {"reasoning_content": ("reasoning_content",),
                                                "reasoning": ("reasoning",), "both": ("reasoning_content", "reasoning")}
# OpenAI's roles → the template's ("function" is the legacy role of a function's result: a tool message).
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool",
         "function": "function"}
# What the validators below accept, as /openapi.json declares it.
TEXT_PART = {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
             "required": ["type", "text"]}
IMAGE_PART = {"type": "object", "properties": {"type": {"const": "image_url"}, "image_url": {
    "type": "object", "properties": {"url": {"type": "string"}, "detail": {"enum": ["auto", "low", "high"]}},
    "required": ["url"]}}, "required": ["type", "image_url"]}
Content = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {
    "anyOf": [TEXT_PART, IMAGE_PART]}}, {"type": "null"}]})]


class ChatMessage(OpenAIRequest):
    role: Annotated[str, WithJsonSchema({"type": "string", "enum": list(ROLES)})]
    content: Content = Field(None, validate_default=True)
    name: str | None = None
    # An assistant's calls (content may then be null), and the call a tool message answers.
    tool_calls: Annotated[Any, WithJsonSchema({"type": "array", "items": CALL_SCHEMA})] = None
    function_call: Annotated[Any, WithJsonSchema({"type": "object"})] = None  # legacy: one call
    tool_call_id: str | None = Field(None, validate_default=True)
    # An assistant turn's thinking, as answers carry it (templates that show earlier thinking read it).
    reasoning_content: str | None = None
    reasoning: str | None = None

    # The `image_url` parts of a user message: (place in `content`, URL), loaded later (edge/images.py).
    _image_urls: list[tuple[int, Any]] = PrivateAttr(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _images(cls, data: Any, handler: ModelWrapValidatorHandler[ChatMessage]) -> ChatMessage:
        message = handler(data)
        content = data.get("content") if isinstance(data, dict) else None
        if isinstance(content, list):
            message._image_urls = [(j, chat_part_url(part)) for j, part in enumerate(content)
                                   if isinstance(part, dict) and part.get("type") == "image_url"]
        return message

    @property
    def image_urls(self) -> list[tuple[int, Any]]:
        return self._image_urls

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        if value not in ROLES:
            raise ParamError(f"unknown role {value!r}; expected one of system, developer, user, assistant, tool")
        return ROLES[value]

    @field_validator("tool_calls")
    @classmethod
    def _tool_calls(cls, value: Any, info: ValidationInfo) -> list[llm_pb2.ToolCall] | None:
        if value is None:
            return None
        if info.data.get("role") != "assistant":
            raise ParamError("only assistant messages have 'tool_calls'")
        return message_tool_calls(value)

    @field_validator("function_call")
    @classmethod
    def _function_call(cls, value: Any, info: ValidationInfo) -> list[llm_pb2.ToolCall] | None:
        if value is None:
            return None
        if info.data.get("role") != "assistant":
            raise ParamError("only assistant messages have a 'function_call'")
        return message_tool_calls([{"function": value}])

    @field_validator("tool_call_id")
    @classmethod
    def _tool_call_id(cls, value: str | None, info: ValidationInfo) -> str | None:
        if info.data.get("role") == "tool" and not value:
            raise ParamError("a 'tool' message needs the 'tool_call_id' of the call it answers")
        return value

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any, info: ValidationInfo) -> str:
        """A string or a list of text parts (joined with newlines) and, in a user message, image parts
        (collected by `_images`); other parts are refused."""
        if value is None and info.data.get("role") == "assistant":
            return ""
        if value is None:
            raise ParamError("'content' is required in a message of this role")
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ParamError("'content' must be a string or an array of content parts")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind == "image_url" and info.data.get("role") == "user":
                if not isinstance(chat_part_url(part), str):
                    raise ParamError(f"content part {i} of type 'image_url' needs 'image_url': {{'url': ...}}")
            elif kind in ("image_url", "input_audio", "file", "refusal"):
                raise ParamError(f"content part {i} is of type '{kind}': only text parts (and image_url parts in "
                                 "user messages) are supported")
            else:
                raise ParamError(f"content part {i} must be an object with type 'text' and a string 'text'")
        return "\n".join(texts)


class ChatCompletionRequest(GenerationRequest):
    """The chat fields (the shared ones are in GenerationRequest)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat = None
    logprobs: bool | None = False
    max_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    tools: Tools = None
    tool_choice: ToolChoiceJson = None
    parallel_tool_calls: bool | None = None
    # Legacy function calling: mapped onto tools; the answer has `function_call` instead of `tool_calls`.
    functions: Annotated[Any, WithJsonSchema({"anyOf": [
        {"type": "array", "maxItems": MAX_TOOLS, "items": FUNCTION_SCHEMA}, {"type": "null"}]})] = None
    function_call: Annotated[Any, WithJsonSchema({"anyOf": [{"enum": ["none", "auto"]}, {
        "type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}, {"type": "null"}]})] = None
    # For reasoning models; reaches the chat template as the variable `reasoning_effort` (as vLLM does for
    # templates that read it, e.g. gpt-oss); templates that do not read it ignore it.
    reasoning_effort: ReasoningEffort | None = None
    # Extension (vLLM, SGLang): extra variables for the chat template, e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None

    _tooling: Tooling = PrivateAttr(default_factory=Tooling)  # tools, tool_choice and response_format, checked

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if self.top_logprobs and not self.logprobs:
            raise ParamError("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
        if self.legacy_functions and (self.tools is not None or self.tool_choice is not None):
            raise ParamError("use 'tools' and 'tool_choice', or the legacy 'functions' and 'function_call', not both",
                             "functions")
        if self.legacy_functions:
            tools = tool_list(self.functions, "functions", "functions") if self.functions is not None else []
            choice = tool_choice(self.function_call, tools, "function_call", "functions")
        else:
            tools = tool_list(self.tools, "tools") if self.tools is not None else []
            choice = tool_choice(self.tool_choice, tools, "tool_choice")
        # A legacy answer holds one function_call.
        self._tooling = Tooling(tools, choice, False if self.legacy_functions else self.parallel_tool_calls,
                                response_guide(self.response_format))
        return self

    @property
    def legacy_functions(self) -> bool:
        return self.functions is not None or self.function_call is not None

    @property
    def tooling(self) -> Tooling:
        return self._tooling


LEGACY_NAMES = {"tools": "functions", "tool_choice": "function_call"}


def message_proto(message: ChatMessage) -> llm_pb2.ChatMessage:
    calls = (message.tool_calls or []) + (message.function_call or [])  # legacy function_call: no id
    tool_call_id = message.tool_call_id or (message.name or "" if message.role == "function" else "")
    return llm_pb2.ChatMessage(role="tool" if message.role == "function" else message.role, content=message.content,
                               name=message.name or "", tool_calls=calls, tool_call_id=tool_call_id,
                               reasoning=message.reasoning_content or message.reasoning or "")


def pending_images(body: ChatCompletionRequest, messages: list[llm_pb2.ChatMessage]) -> list[PendingImage]:
    return [PendingImage(proto, url, f"messages[{i}].content[{j}].image_url.url")
            for i, (message, proto) in enumerate(zip(body.messages, messages, strict=True))
            for j, url in message.image_urls]


def generation_input(body: ChatCompletionRequest) -> GenerationInput:
    variables = {**({"reasoning_effort": body.reasoning_effort} if body.reasoning_effort else {}),
                 **(body.chat_template_kwargs or {})}
    messages = [message_proto(m) for m in body.messages]
    return GenerationInput(
        model=body.model, sampling=body.sampling(body.max_completion_tokens or body.max_tokens),
        messages=messages, images=pending_images(body, messages), stream=bool(body.stream), tooling=body.tooling,
        template_variables=variables, logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs or 0,
        names=LEGACY_NAMES if body.legacy_functions else {}, affinity=body.affinity)


# The response and its stream chunks, as /openapi.json declares them (OpenAI's ChatCompletion and
# ChatCompletionChunk, restricted to what this server sends).
class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ResponseModel):
    content: list[TokenLogprob] | None
    refusal: None


class FunctionCall(ResponseModel):
    name: str
    arguments: str  # a JSON object, as text


class ToolCall(ResponseModel):
    id: str
    type: Literal["function"]
    function: FunctionCall


class AssistantMessage(ResponseModel):
    role: Literal["assistant"]
    content: str | None  # null when the message only calls tools, or only thinks (cut by max_tokens)
    refusal: None
    # Extensions: a reasoning model's thinking, under the name(s) the `reasoning_field` setting gives.
    reasoning_content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    function_call: FunctionCall | None = None  # instead of tool_calls, for legacy `functions`


FinishReason = Literal["stop", "length", "tool_calls", "function_call"]


class Choice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(Head):
    object: Literal["chat.completion"]
    choices: list[Choice]
    usage: Usage


class FunctionCallPiece(ResponseModel):
    name: str | None = None  # in the call's first piece
    arguments: str


class ToolCallPiece(ResponseModel):
    index: int
    id: str | None = None  # id, type and name come in the call's first piece
    type: Literal["function"] | None = None
    function: FunctionCallPiece


class ChunkDelta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None  # extensions, as in AssistantMessage
    reasoning: str | None = None
    tool_calls: list[ToolCallPiece] | None = None
    function_call: FunctionCallPiece | None = None  # legacy `functions`


class ChunkChoice(ResponseModel):
    index: int
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason | None


class ChatCompletionChunk(Head):
    """One `data:` event of a stream; with `stream_options.include_usage` every chunk has `usage`: null,
    and one last chunk with no choices carries it."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ChatShape:
    object = "chat.completion.chunk"
    prefix = "chatcmpl-"

    def __init__(self, logprobs: bool, legacy_functions: bool = False,
                 reasoning_field: ReasoningField = "reasoning_content") -> None:
        self.logprobs = logprobs
        self.legacy = legacy_functions  # answer with `function_call`, as OpenAI did for `functions`
        self.reasoning_fields = REASONING_FIELDS[reasoning_field]

    def _logprobs(self, entries: list[llm_pb2.TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        content = [{"token": e.token, "logprob": e.logprob, "bytes": list(e.bytes) or None,
                    "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.bytes) or None}
                                     for t in e.top_logprobs]}
                   for e in entries]
        return {"content": content, "refusal": None}

    def opening(self, index: int) -> dict[str, Any] | None:
        return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                "finish_reason": None}

    def delta(self, delta: llm_pb2.Delta) -> dict[str, Any]:
        body: dict[str, Any] = {"content": delta.text} if delta.text or not (delta.tool_calls or delta.reasoning) \
            else {}
        if delta.reasoning:
            body.update(dict.fromkeys(self.reasoning_fields, delta.reasoning))
        if delta.tool_calls and self.legacy:
            body["function_call"] = delta_json(delta.tool_calls[0], legacy=True)
        elif delta.tool_calls:
            body["tool_calls"] = [delta_json(piece, legacy=False) for piece in delta.tool_calls]
        return {"index": delta.index, "delta": body, "logprobs": self._logprobs(list(delta.logprobs)),
                "finish_reason": None}

    def _reason(self, finish_reason: str) -> str:
        return "function_call" if self.legacy and finish_reason == "tool_calls" else finish_reason

    def end(self, index: int, finish_reason: str) -> dict[str, Any]:
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": self._reason(finish_reason)}

    def message(self, choice: Collected) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": choice.text, "refusal": None}
        if choice.reasoning:
            message["content"] = choice.text or None  # all thinking: no answer yet
            message.update(dict.fromkeys(self.reasoning_fields, choice.reasoning))
        if choice.tool_calls:
            message["content"] = choice.text or None
            if self.legacy:
                message["function_call"] = call_json(choice.tool_calls[0], legacy=True)
            else:
                message["tool_calls"] = [call_json(call, legacy=False) for call in choice.tool_calls]
        return message

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        return {
            **head,
            "object": "chat.completion",
            "choices": [{"index": i, "message": self.message(c), "logprobs": self._logprobs(c.logprobs),
                         "finish_reason": self._reason(c.finish_reason)}
                        for i, c in enumerate(choices)],
            "usage": usage_object(usage),
        }


def shape(body: ChatCompletionRequest, reasoning_field: ReasoningField = "reasoning_content") -> ChatShape:
    return ChatShape(bool(body.logprobs), body.legacy_functions, reasoning_field)
