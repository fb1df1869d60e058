"""POST /v1/embeddings (the rules and shapes are in edge/endpoints/embeddings.py); a lean route
(edge/lean.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import ok
from edge.app_state import edge_state
from edge.endpoints import embeddings
from edge.lean import lean_router

router = lean_router()


@router.post("/v1/embeddings", tags=["embeddings"], responses=ok(embeddings.CreateEmbeddingResponse))
async def create_embeddings(body: embeddings.EmbeddingRequest, request: Request) -> Response:
    state = edge_state(request)
    client = state.clients.embed
    model = body.model or await client.directory.default(client.service, state.settings.default_embedding_model)
    proto = embeddings.to_proto(body, model)
    response = await client.embed(proto)
    return Response(embeddings.to_json(response, body.encoding_format), media_type="application/json")
