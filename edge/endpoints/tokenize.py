"""POST /tokenize and POST /detokenize, with vLLM's shapes, for every kind of model: the service that
serves the model tokenizes with the model's own tokenizer (and, for a chat, its chat template). /tokenize
also takes TEI's body (edge/endpoints/tei.py), told apart by its `inputs` (`either_request`)."""

from __future__ import annotations

from typing import Annotated, Any, Self

from fastapi import Request
from pydantic import Field, model_validator

from edge.endpoints.chat import ChatMessage
from edge.endpoints.common import UINT32_MAX, OpenAIRequest, ResponseModel
from edge.endpoints.tei import TEITokenizeRequest
from edge.errors import ParamError, tei_body, use_error_body
from edge.lean import parse_body
from tritongate.common.v1 import tokenizer_pb2


class TokenizeRequest(OpenAIRequest):
    """vLLM's two shapes in one: `prompt` (text) or `messages` (a chat)."""

    model: str
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true for `prompt`, false for `messages`
    add_generation_prompt: bool | None = True  # (chats are rendered with the generation prompt)

    @model_validator(mode="after")
    def _one_input(self) -> Self:
        if (self.prompt is None) == (self.messages is None):
            raise ParamError("Send either 'prompt' or 'messages'.", "prompt" if self.prompt is None else "messages")
        if self.messages is not None and self.add_generation_prompt is False:
            raise ParamError("'add_generation_prompt': false is not supported; chats are tokenized as they are "
                             "sent to the model.", "add_generation_prompt")
        if self.messages is not None and self.add_special_tokens:
            raise ParamError("'add_special_tokens' applies to 'prompt' only; a chat template adds its own.",
                             "add_special_tokens")
        return self


# /tokenize takes either body; /openapi.json declares both.
EITHER_SCHEMA = {"anyOf": [TokenizeRequest.model_json_schema(), TEITokenizeRequest.model_json_schema()]}


def either_request(body: dict[str, Any], request: Request) -> TokenizeRequest | TEITokenizeRequest:
    """A /tokenize body as the request of the API it speaks: TEI's when it has `inputs` (its errors are then
    in TEI's shape), else vLLM's."""
    if "inputs" in body:
        use_error_body(request, tei_body)
        return parse_body(TEITokenizeRequest, body, request)
    return parse_body(TokenizeRequest, body, request)


class DetokenizeRequest(OpenAIRequest):
    model: str
    tokens: list[Annotated[int, Field(ge=0, le=UINT32_MAX)]]


class TokenizeResponse(ResponseModel):
    count: int
    max_model_len: int
    tokens: list[int]


class DetokenizeResponse(ResponseModel):
    prompt: str


def to_proto(body: TokenizeRequest) -> tokenizer_pb2.TokenizeRequest:
    if body.messages is not None:
        chat = tokenizer_pb2.TokenizerChat(messages=[tokenizer_pb2.TokenizerChatMessage(role=m.role, content=m.content)
                                                     for m in body.messages])
        return tokenizer_pb2.TokenizeRequest(model=body.model, chat=chat)
    return tokenizer_pb2.TokenizeRequest(model=body.model, prompt=body.prompt or "",
                                         add_special_tokens=body.add_special_tokens is not False)


def detokenize_proto(body: DetokenizeRequest) -> tokenizer_pb2.DetokenizeRequest:
    return tokenizer_pb2.DetokenizeRequest(model=body.model, tokens=body.tokens)


def tokenized(response: tokenizer_pb2.TokenizeResponse) -> dict[str, Any]:
    return {"count": len(response.tokens), "max_model_len": response.max_model_len, "tokens": list(response.tokens)}


def detokenized(response: tokenizer_pb2.DetokenizeResponse) -> dict[str, Any]:
    return {"prompt": response.prompt}
