"""Rerank requests and answers: Denglin openai_api's /v1/rerank (whose answer Cohere's and Jina's
clients read too, from `results`), Hugging Face TEI's /rerank (a /rerank body with `texts` is TEI's) and
NVIDIA NIM's /v1/ranking."""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, Self

from fastapi import Request
from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator

from edge.app_state import limits_of
from edge.endpoints.common import OpenAIRequest, ResponseModel, check_count
from edge.errors import ParamError, tei_body, use_error_body
from edge.keys.caller import Prioritized
from edge.lean import parse_body
from tritongate.rerank.v1 import rerank_pb2


def _text(value: Any, i: int) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("text"), str):
        return str(value["text"])
    raise ParamError(f"documents[{i}] must be a string or an object with a string `text`", "documents")


# What the validators accept, as /openapi.json declares it.
DOCUMENTS = {"type": "array", "minItems": 1, "items": {"anyOf": [
    {"type": "string"}, {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}]}}
TOP_N = {"anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}]}  # numeric strings pass too (Denglin's)


class RerankRequest(OpenAIRequest, Prioritized):
    """Denglin's request; `documents` may also be Cohere/Jina objects with `text`."""

    model: str
    query: Annotated[str, Field(min_length=1)]
    documents: Annotated[list[Any], WithJsonSchema(DOCUMENTS)]
    top_n: Annotated[int | None, WithJsonSchema(TOP_N)] = None
    return_documents: bool = False

    @field_validator("documents")
    @classmethod
    def _documents(cls, value: list[Any]) -> list[str]:
        if not value:
            raise ParamError("'documents' must not be empty", "documents")
        return [_text(item, i) for i, item in enumerate(value)]

    @field_validator("top_n", mode="before")
    @classmethod
    def _top_n(cls, value: Any) -> Any:
        """An int, or a numeric string as Denglin's manual allows; at least 1."""
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ParamError("'top_n' must be an integer", "top_n")
        if value is not None and value < 1:
            raise ParamError("'top_n' must be at least 1", "top_n")
        return value

    @model_validator(mode="after")
    def _within_limit(self, info: ValidationInfo) -> Self:
        check_count(len(self.documents), limits_of(info).max_rerank_documents, "documents")
        return self


class TEIRerankRequest(OpenAIRequest):
    """Hugging Face text-embeddings-inference's /rerank. TEI names no model: the default rerank model
    (TRITONGATE_DEFAULT_RERANK_MODEL) serves it unless `model` picks one."""

    model: str | None = None
    query: Annotated[str, Field(min_length=1)]
    texts: Annotated[list[str], Field(min_length=1)]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False

    @model_validator(mode="after")
    def _within_limit(self, info: ValidationInfo) -> Self:
        check_count(len(self.texts), limits_of(info).max_rerank_documents, "documents")
        return self


# /rerank takes either body; /openapi.json declares both.
EITHER_SCHEMA = {"anyOf": [RerankRequest.model_json_schema(), TEIRerankRequest.model_json_schema()]}


def either_request(body: dict[str, Any], request: Request) -> RerankRequest | TEIRerankRequest:
    """A /rerank body as the request of the API it speaks: TEI's when it has `texts` and no `documents` (its
    errors are then in TEI's shape), else Denglin's."""
    if "texts" in body and "documents" not in body:
        use_error_body(request, tei_body)
        return parse_body(TEIRerankRequest, body, request)
    return parse_body(RerankRequest, body, request)


def to_proto(body: RerankRequest) -> rerank_pb2.RerankRequest:
    top_n = min(body.top_n or 0, len(body.documents))  # more than there are documents: all of them
    return rerank_pb2.RerankRequest(model=body.model, query=body.query, documents=body.documents, top_n=top_n)


def tei_to_proto(body: TEIRerankRequest, model: str) -> rerank_pb2.RerankRequest:
    return rerank_pb2.RerankRequest(model=model, query=body.query, documents=body.texts,
                                    raw_scores=body.raw_scores, truncate=body.truncate)


class NIMText(OpenAIRequest):
    text: str


class RankingRequest(OpenAIRequest):
    """NVIDIA NIM's /v1/ranking (LangChain's NVIDIARerank). `truncate` NONE refuses a passage that does not
    fit beside the query, END cuts it; unset: the model's configuration."""

    model: str
    query: NIMText
    passages: Annotated[list[NIMText], Field(min_length=1)]
    truncate: Literal["NONE", "END"] | None = None

    @model_validator(mode="after")
    def _within_limit(self, info: ValidationInfo) -> Self:
        check_count(len(self.passages), limits_of(info).max_rerank_documents, "passages")
        return self


def ranking_proto(body: RankingRequest) -> rerank_pb2.RerankRequest:
    """The model's raw scores: NIM answers logits."""
    request = rerank_pb2.RerankRequest(model=body.model, query=body.query.text,
                                       documents=[p.text for p in body.passages], raw_scores=True)
    if body.truncate is not None:
        request.truncate = body.truncate == "END"
    return request


class Ranking(ResponseModel):
    index: int
    logit: float


class RankingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class RankingResponse(ResponseModel):
    rankings: list[Ranking]  # best first
    usage: RankingUsage


def ranking_response(answer: rerank_pb2.RerankResponse) -> dict[str, Any]:
    return {"rankings": [{"index": r.index, "logit": r.score} for r in answer.results],
            "usage": {"prompt_tokens": answer.usage.prompt_tokens, "total_tokens": answer.usage.total_tokens}}


class RerankDocument(ResponseModel):
    text: str


class RerankResult(ResponseModel):
    object: Literal["rerank"]
    index: int
    relevance_score: float
    document: RerankDocument | None = None  # with `return_documents`


class RerankUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int


class RerankResponse(ResponseModel):
    """Denglin's answer (`data`) with Cohere's and Jina's name for the same list (`results`)."""

    id: str
    object: Literal["list"]
    model: str
    data: list[RerankResult]
    results: list[RerankResult]
    usage: RerankUsage


class TEIRank(ResponseModel):
    index: int
    score: float
    text: str | None = None  # with `return_text`


TEIRerankResponse = list[TEIRank]


def response(body: RerankRequest, answer: rerank_pb2.RerankResponse) -> dict[str, Any]:
    results = []
    for result in answer.results:
        entry: dict[str, Any] = {"object": "rerank", "index": result.index, "relevance_score": result.score}
        if body.return_documents:
            entry["document"] = {"text": body.documents[result.index]}
        results.append(entry)
    usage = answer.usage
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "object": "list",
        "model": answer.model,
        "data": results,
        "results": results,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens, "completion_tokens": 0},
    }


def tei_response(body: TEIRerankRequest, answer: rerank_pb2.RerankResponse) -> list[dict[str, Any]]:
    return [{"index": r.index, "score": r.score, **({"text": body.texts[r.index]} if body.return_text else {})}
            for r in answer.results]
