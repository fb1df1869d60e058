"""Hugging Face text-embeddings-inference's own routes, as its clients (Dify's TEI provider, LangChain's
HuggingFaceEndpointEmbeddings, LlamaIndex's TextEmbeddingsInference) call them: GET /info, POST /embed and
POST /tokenize (its /rerank is in edge/endpoints/rerank.py). A TEI server serves one model: these routes
serve the default embedding model unless the body names one in `model`."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

import numpy as np
import orjson
from pydantic import Field, RootModel, ValidationInfo, WithJsonSchema, field_validator, model_validator

from edge.app_state import limits_of
from edge.endpoints.common import UINT32_MAX, OpenAIRequest, ResponseModel, batch_schema
from edge.endpoints.common import text_or_token_batch as _batch
from edge.endpoints.embeddings import batch_proto
from edge.errors import ParamError
from tritongate.common.v1 import common_pb2, tokenizer_pb2
from tritongate.embed.v1 import embed_pb2

VERSION = "1.8.0"  # the TEI release whose API these routes follow


def _inputs(value: Any, empty_strings: bool) -> list[Any]:
    if isinstance(value, list) and not value:  # TEI's own kind of error ("Empty")
        raise ParamError("`inputs` cannot be empty", "inputs", "empty")
    return _batch(value, "inputs", empty_strings)


class TEIEmbedRequest(OpenAIRequest):
    inputs: Annotated[Any, WithJsonSchema(batch_schema(empty_strings=False))]
    model: str | None = None  # not TEI's: picks one of several embedding models
    normalize: bool = True
    truncate: bool | None = None  # unset: the model's configuration
    truncation_direction: Literal["Left", "Right", "left", "right"] = "Right"
    prompt_name: str | None = None
    dimensions: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: Any) -> list[str] | list[list[int]]:
        return _inputs(value, empty_strings=False)

    @model_validator(mode="after")
    def _batch_size(self, info: ValidationInfo) -> Self:
        """TEI refuses a batch over its `max_client_batch_size` (TRITONGATE_MAX_EMBEDDING_INPUTS) as too
        large (413)."""
        most = limits_of(info).max_embedding_inputs
        if len(self.inputs) > most:
            raise ParamError(f"batch size {len(self.inputs)} > maximum allowed batch size {most}", "inputs",
                             status=413)
        return self


def embed_proto(body: TEIEmbedRequest, model: str) -> embed_pb2.EmbedRequest:
    request = batch_proto(body.inputs, model)
    request.dimensions = body.dimensions or 0
    request.prompt_name = body.prompt_name or ""
    request.normalize = body.normalize
    if body.truncate is not None:
        request.truncation = (embed_pb2.TRUNCATION_NONE if not body.truncate
                              else embed_pb2.TRUNCATION_START if body.truncation_direction.lower() == "left"
                              else embed_pb2.TRUNCATION_END)
    return request


class TEIEmbedResponse(RootModel[list[list[float]]]):
    """One vector per input, in order."""


def embed_json(response: embed_pb2.EmbedResponse) -> bytes:
    """TEI's answer: the bare list of vectors."""
    vectors = np.frombuffer(response.embeddings, dtype="<f4").reshape(response.rows, response.dimensions)
    return orjson.dumps(vectors, option=orjson.OPT_SERIALIZE_NUMPY)


class TEITokenizeRequest(OpenAIRequest):
    """TEI's /tokenize body (`inputs`), told apart from vLLM's (`prompt` or `messages`) by `inputs`."""

    inputs: Annotated[Any, WithJsonSchema(batch_schema(empty_strings=True))]
    model: str | None = None  # not TEI's: picks one of several models
    add_special_tokens: bool = True

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: Any) -> list[str]:
        texts = _inputs(value, empty_strings=True)
        if not isinstance(texts[0], str):
            raise ParamError("`inputs` must be a string or a list of strings", "inputs")
        return texts


def tokenize_protos(body: TEITokenizeRequest, model: str) -> list[tokenizer_pb2.TokenizeRequest]:
    return [tokenizer_pb2.TokenizeRequest(model=model, prompt=text, add_special_tokens=body.add_special_tokens,
                                          spans=True) for text in body.inputs]


class TEIToken(ResponseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


TEITokenizeResponse = list[list[TEIToken]]


def tokens(answer: tokenizer_pb2.TokenizeResponse) -> list[dict[str, Any]]:
    """One input's tokens as TEI writes them (an added special token has no place in the text)."""
    return [{"id": token, "text": span.text, "special": span.special,
             "start": None if span.special else span.start, "stop": None if span.special else span.stop}
            for token, span in zip(answer.tokens, answer.spans, strict=True)]


class TEIInfo(ResponseModel):
    model_id: str
    model_sha: str | None
    model_dtype: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str


def info(card: common_pb2.ModelCard, max_batch: int) -> dict[str, Any]:
    """TEI's /info for the model of `card` (Dify's TEI provider reads `model_type`, `max_input_length` and
    `max_client_batch_size`)."""
    rerank = card.kind == common_pb2.MODEL_KIND_RERANK
    return {
        "model_id": card.id,
        "model_sha": None,
        "model_dtype": "float32",
        "model_type": {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}} if rerank
        else {"embedding": {"pooling": "model"}},
        "max_concurrent_requests": 512,
        "max_input_length": card.max_model_len,
        "max_batch_tokens": card.max_model_len * max_batch,
        "max_batch_requests": None,
        "max_client_batch_size": max_batch,
        "auto_truncate": True,
        "tokenization_workers": 1,
        "version": VERSION,
    }
