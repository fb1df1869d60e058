"""POST /v1/chat/completions: the request in the order of OpenAI's CreateChatCompletionRequest (our
extensions last), and the shape of its responses and stream chunks."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator

from edge.errors import bad_request
from edge.protocol.common import UINT32_MAX, OpenAIRequest
from edge.protocol.generation import Collected, GenerationRequest, usage_object
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
            raise ValueError(f"'{value}' messages are not supported yet (roles: system, user, assistant)")
        if value not in ROLES:
            raise ValueError(f"unknown role {value!r}; expected one of system, developer, user, assistant")
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
            raise ValueError("'content' must be a string or an array of content parts")
        texts = []
        for i, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text" and isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif kind in ("image_url", "input_audio", "file", "refusal"):
                raise ValueError(f"content part {i} is of type '{kind}': only text parts are supported")
            else:
                raise ValueError(f"content part {i} must be an object with type 'text' and a string 'text'")
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

    def check(self) -> None:
        super().check()
        if self.tools:
            raise bad_request("'tools' are not supported yet.", "tools")
        if self.tool_choice not in (None, "none", "auto"):
            raise bad_request("'tool_choice' needs 'tools', which are not supported yet.", "tool_choice")
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            raise bad_request(f"'response_format' of type {kind!r} is not supported; only 'text'.",
                              "response_format")
        if self.top_logprobs and not self.logprobs:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true.", "top_logprobs")


class ChatShape:
    object = "chat.completion.chunk"
    prefix = "chatcmpl"

    def __init__(self, logprobs: bool) -> None:
        self.logprobs = logprobs

    def _logprobs(self, entries: list[llm_pb2.TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        content = [{"token": e.token, "logprob": e.logprob, "bytes": list(e.bytes) or None, "top_logprobs": []}
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
