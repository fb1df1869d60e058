"""POST /v1/embeddings (the rules and shapes are in edge/endpoints/embeddings.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import api_router, ok
from edge.cancel import until_disconnected
from edge.deps import EmbedDep, SettingsDep
from edge.endpoints import embeddings

router = api_router()


@router.post("/v1/embeddings", tags=["embeddings"], responses=ok(embeddings.CreateEmbeddingResponse))
async def create_embeddings(body: embeddings.EmbeddingRequest, request: Request, embed: EmbedDep,
                            settings: SettingsDep) -> Response:
    proto = embeddings.to_proto(body, settings.max_embedding_inputs)
    response = await until_disconnected(request, embed.embed(proto))
    return Response(embeddings.to_json(response, body.encoding_format), media_type="application/json")
