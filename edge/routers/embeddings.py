"""POST /v1/embeddings."""

from __future__ import annotations

import base64

import numpy as np
import orjson
from fastapi import Request, Response

from edge.cancel import until_disconnected
from edge.clients import call
from edge.errors import bad_request
from edge.protocol.embeddings import EmbeddingRequest
from edge.routing import api_router
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2

router = api_router()


def to_proto(body: EmbeddingRequest) -> embed_pb2.EmbedRequest:
    request = embed_pb2.EmbedRequest(model=body.model, dimensions=body.dimensions or 0)
    if isinstance(body.input[0], str):
        request.texts.texts.extend(body.input)
    else:
        request.tokens.inputs.extend(common_pb2.TokenIds(ids=ids) for ids in body.input)
    return request


def to_json(response: embed_pb2.EmbedResponse, encoding_format: str) -> bytes:
    vectors = np.frombuffer(response.embeddings, dtype="<f4").reshape(response.rows, response.dimensions)
    encoded: list[object] | np.ndarray
    if encoding_format == "base64":
        encoded = [base64.b64encode(row.tobytes()).decode("ascii") for row in vectors]
    else:
        encoded = vectors  # orjson writes float32 rows directly
    usage = {"prompt_tokens": response.usage.prompt_tokens, "total_tokens": response.usage.total_tokens}
    return orjson.dumps({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": e} for i, e in enumerate(encoded)],
        "model": response.model,
        "usage": usage,
    }, option=orjson.OPT_SERIALIZE_NUMPY)


@router.post("/v1/embeddings", tags=["embeddings"])
async def create_embeddings(body: EmbeddingRequest, request: Request) -> Response:
    state = request.app.state
    if len(body.input) > state.settings.max_embedding_inputs:
        raise bad_request(f"'input' has {len(body.input)} items; at most {state.settings.max_embedding_inputs} "
                          "are allowed per request.", "input")
    card, backend = await state.directory.route(body.model, "embedding")
    if body.dimensions and card.dimensions and body.dimensions > card.dimensions:
        raise bad_request(f"'dimensions' is {body.dimensions}, but `{body.model}` has {card.dimensions}.",
                          "dimensions")
    response = await until_disconnected(request, call(backend, "Embed", to_proto(body), state.settings.unary_timeout_s))
    return Response(to_json(response, body.encoding_format), media_type="application/json")
