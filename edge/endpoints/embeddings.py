"""POST /v1/embeddings: the request in the order of OpenAI's CreateEmbeddingRequest, its EmbedRequest
(and the per-request input limit), and the response, written straight from the float32 buffer."""

from __future__ import annotations

import base64
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from pydantic import Field, WithJsonSchema, field_validator

from edge.endpoints.common import (
    UINT32_MAX,
    OpenAIRequest,
    ParamError,
    ResponseModel,
    batch_schema,
    text_or_token_batch,
)
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2


class EmbeddingRequest(OpenAIRequest):
    input: Annotated[Any, WithJsonSchema(batch_schema(empty_strings=False))]
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None  # the embed service checks the width
    user: str | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[str] | list[list[int]]:
        return text_or_token_batch(value, "input", empty_strings=False)


def to_proto(body: EmbeddingRequest, max_inputs: int) -> embed_pb2.EmbedRequest:
    """The EmbedRequest; more than `max_inputs` inputs (the edge's TRITONGATE_MAX_EMBEDDING_INPUTS) are refused."""
    if len(body.input) > max_inputs:
        raise ParamError(f"'input' has {len(body.input)} items; at most {max_inputs} are allowed per request.",
                         "input")
    request = embed_pb2.EmbedRequest(model=body.model, dimensions=body.dimensions or 0)
    if isinstance(body.input[0], str):
        request.texts.texts.extend(body.input)
    else:
        request.tokens.inputs.extend(common_pb2.TokenIds(ids=ids) for ids in body.input)
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
