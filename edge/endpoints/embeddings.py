"""POST /v1/embeddings: the request in the order of OpenAI's CreateEmbeddingRequest (with NVIDIA NIM's
`input_type` and `truncate`) and its rules (the per-request input limit among them), its EmbedRequest, and
the response, written straight from the float32 buffer."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal, Self

import numpy as np
import orjson
from pydantic import Field, ValidationInfo, WithJsonSchema, field_validator, model_validator

from edge.app_state import limits_of
from edge.endpoints.common import (
    UINT32_MAX,
    OpenAIRequest,
    ResponseModel,
    batch_schema,
    check_count,
    text_or_token_batch,
)
from edge.keys.caller import Prioritized
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2

# NIM's `input_type` and `truncate`, as the EmbedRequest says them.
INPUT_TYPES = {"query": embed_pb2.INPUT_TYPE_QUERY, "passage": embed_pb2.INPUT_TYPE_PASSAGE}
TRUNCATIONS = {"NONE": embed_pb2.TRUNCATION_NONE, "END": embed_pb2.TRUNCATION_END,
               "START": embed_pb2.TRUNCATION_START}


class EmbeddingRequest(OpenAIRequest, Prioritized):
    input: Annotated[Any, WithJsonSchema(batch_schema(empty_strings=False))]
    model: str | None = None  # TEI's clients (Dify's) name none: TRITONGATE_DEFAULT_EMBEDDING_MODEL's
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None  # the embed service checks the width
    user: str | None = None
    # NVIDIA NIM's: the model's `query` or `passage` prompt goes before each text; over-long inputs are
    # refused (NONE) or cut, keeping the start (END) or the end (START). Unset: the model's configuration.
    input_type: Literal["query", "passage"] | None = None
    truncate: Literal["NONE", "START", "END"] | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[str] | list[list[int]]:
        return text_or_token_batch(value, "input", empty_strings=False)

    @model_validator(mode="after")
    def _within_limit(self, info: ValidationInfo) -> Self:
        check_count(len(self.input), limits_of(info).max_embedding_inputs, "input", per_request=True)
        return self


def to_proto(body: EmbeddingRequest, model: str) -> embed_pb2.EmbedRequest:
    """The EmbedRequest for `model`."""
    request = batch_proto(body.input, model)
    request.dimensions = body.dimensions or 0
    request.input_type = INPUT_TYPES.get(body.input_type or "", embed_pb2.INPUT_TYPE_UNSPECIFIED)
    request.truncation = TRUNCATIONS.get(body.truncate or "", embed_pb2.TRUNCATION_DEFAULT)
    return request


def batch_proto(inputs: list[str] | list[list[int]], model: str) -> embed_pb2.EmbedRequest:
    """An EmbedRequest of `inputs` (texts or token ids)."""
    request = embed_pb2.EmbedRequest(model=model)
    if isinstance(inputs[0], str):
        request.texts.texts.extend(inputs)
    else:
        request.tokens.inputs.extend(common_pb2.TokenIds(ids=ids) for ids in inputs)
    return request


class Embedding(ResponseModel):
    object: Literal["embedding"]
    index: int
    embedding: list[float] | str  # `encoding_format` base64: the float32 values, little-endian, in base64


class EmbeddingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class CreateEmbeddingResponse(ResponseModel):
    object: Literal["list"]
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


def to_json(response: embed_pb2.EmbedResponse, encoding_format: str) -> bytes:
    """CreateEmbeddingResponse as JSON: orjson writes the float32 rows without Python floats."""
    vectors = np.frombuffer(response.embeddings, dtype="<f4").reshape(response.rows, response.dimensions)
    encoded: list[object] | np.ndarray
    if encoding_format == "base64":
        encoded = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    else:
        encoded = vectors
    usage = {"prompt_tokens": response.usage.prompt_tokens, "total_tokens": response.usage.total_tokens}
    return orjson.dumps({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
        "model": response.model,
        "usage": usage,
    }, option=orjson.OPT_SERIALIZE_NUMPY)
