"""POST /v1/chat/completions: the request in the order of OpenAI's CreateChatCompletionRequest (our
extensions last) with its rules, its GenerateRequest, and its response and stream chunks."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import UINT32_MAX, Head, OpenAIRequest, ParamError, ResponseModel, Usage, usage_object
from edge.endpoints.llm_common import Collected, GenerationRequest
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
NOT_YET = ("tool", "function")
# What the validators below accept, as /openapi.json declares it.
TEXT_PART = {"type": "object", "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
             "required": ["type", "text"]}
Content = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}]})]


class ChatMessage(OpenAIRequest):
    role: Annotated[str, WithJsonSchema({"type": "string", "enum": list(ROLES)})]
    content: Content = Field(...)
    name: str | None = None

    @field_validator("role")
    @classmethod
    def _role(cls, value: str) -> str:
        if value in NOT_YET:
            raise ParamError(f"'{value}' messages are not supported yet (roles: system, user, assistant)")
        if value not in ROLES:
            raise ParamError(f"unknown role {value!r}; expected one of system, developer, user, assistant")
        return ROLES[value]

    @field_validator("content")
    @classmethod
    def _content(cls, value: Any, info: ValidationInfo) -> str:
        """A string or a list of text parts (joined with newlines); other parts are refused."""
        if value is None and info.data.get("role") == "assistant":
            return ""
        if isinstance(value, str):
            return value
        if not isinstance(value, list):
            raise ParamError("'content' must be a string or an array of content parts")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image_url", "input_audio", "file", "refusal"):
                raise ParamError(f"content part {i} is of type '{kind}': only text parts are supported")
            else:
                raise ParamError(f"content part {i} must be an object with type 'text' and a string 'text'")
        return "\n".join(texts)


class ChatCompletionRequest(GenerationRequest):
    """The chat fields (the shared ones are in GenerationRequest)."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None
    response_format: Annotated[dict[str, Any] | None, WithJsonSchema({"anyOf": [
        {"type": "object", "properties": {"type": {"const": "text"}}}, {"type": "null"}]})] = None
    logprobs: bool | None = False
    max_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    tools: Annotated[list[Any] | None, WithJsonSchema({"anyOf": [{"type": "array", "maxItems": 0},
                                                                  {"type": "null"}]})] = None  # not yet
    tool_choice: Annotated[Any, WithJsonSchema({"enum": ["none", "auto", None]})] = None
    # For reasoning models; reaches the chat template as the variable `reasoning_effort` (as vLLM does for
    # templates that read it, e.g. gpt-oss); templates that do not read it ignore it.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    # Extension (vLLM, SGLang): extra variables for the chat template, e.g. {"enable_thinking": false}.
    chat_template_kwargs: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if self.tools:
            raise ParamError("'tools' are not supported yet.", "tools")
        if self.tool_choice not in (None, "none", "auto"):
            raise ParamError("'tool_choice' needs 'tools', which are not supported yet.", "tool_choice")
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise ParamError(f"'response_format' of type {kind!r} is not supported; only 'text'.", "response_format")
        if self.top_logprobs and not self.logprobs:
            raise ParamError("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")
        return self


def to_proto(body: ChatCompletionRequest) -> llm_pb2.GenerateRequest:
    messages = [llm_pb2.ChatMessage(role=m.role, content=m.content, name=m.name or "") for m in body.messages]
    proto = body.proto(body.max_completion_tokens or body.max_tokens, chat=llm_pb2.Chat(messages=messages),
                       logprobs=bool(body.logprobs), top_logprobs=body.top_logprobs or 0)
    variables = {**({"reasoning_effort": body.reasoning_effort} if body.reasoning_effort else {}),
                 **(body.chat_template_kwargs or {})}
    if variables:
        proto.chat_template_kwargs.update(variables)
    return proto


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


class AssistantMessage(ResponseModel):
    role: Literal["assistant"]
    content: str | None
    refusal: None


FinishReason = Literal["stop", "length"]


class Choice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: FinishReason


class ChatCompletion(Head):
    object: Literal["chat.completion"]
    choices: list[Choice]
    usage: Usage


class ChunkDelta(ResponseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


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
    prefix = "chatcmpl"

    def __init__(self, logprobs: bool) -> None:
        self.logprobs = logprobs

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
        return {"index": delta.index, "delta": {"content": delta.text},
                "logprobs": self._logprobs(list(delta.logprobs)), "finish_reason": None}

    def end(self, index: int, finish_reason: str) -> dict[str, Any]:
        return {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish_reason}

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        return {
            **head,
            "object": "chat.completion",
            "choices": [{"index": i, "message": {"role": "assistant", "content": c.text, "refusal": None},
                         "logprobs": self._logprobs(c.logprobs), "finish_reason": c.finish_reason}
                        for i, c in enumerate(choices)],
            "usage": usage_object(usage),
        }


def shape(body: ChatCompletionRequest) -> ChatShape:
    return ChatShape(bool(body.logprobs))
