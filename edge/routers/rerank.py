"""Rerank at /v1/rerank, /v2/rerank, /rerank and NIM's /v1/ranking (the rules and shapes are in
edge/endpoints/rerank.py); lean routes (edge/lean.py)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Request, Response
from pydantic import WithJsonSchema

from edge.api_router import EITHER_ERRORS, ok
from edge.app_state import edge_state
from edge.endpoints import rerank
from edge.lean import lean_router

router = lean_router(tags=["rerank"])


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/rerank", responses=ok(rerank.RerankResponse))
@router.post("/v2/rerank", responses=ok(rerank.RerankResponse))
async def rerank_documents(body: rerank.RerankRequest, request: Request) -> Response:
    answer = await edge_state(request).clients.rerank.rerank(rerank.to_proto(body))
    return _json(rerank.response(body, answer))


@router.post("/rerank", responses={**ok(rerank.RerankResponse | rerank.TEIRerankResponse), **EITHER_ERRORS})
async def rerank_any(body: Annotated[dict[str, Any], WithJsonSchema(rerank.EITHER_SCHEMA)], request: Request
                     ) -> Response:
    """RAGFlow posts Denglin's body here without /v1; TEI clients post `texts`."""
    parsed = rerank.either_request(body, request)
    if isinstance(parsed, rerank.RerankRequest):
        return await rerank_documents(parsed, request)
    state = edge_state(request)
    client = state.clients.rerank
    model = parsed.model or await client.directory.default(client.service, state.settings.default_rerank_model)
    answer = await client.rerank(rerank.tei_to_proto(parsed, model))
    return _json(rerank.tei_response(parsed, answer))


@router.post("/v1/ranking", responses=ok(rerank.RankingResponse))
async def rank_passages(body: rerank.RankingRequest, request: Request) -> Response:
    """NVIDIA NIM's reranking API (LangChain's NVIDIARerank posts here)."""
    answer = await edge_state(request).clients.rerank.rerank(rerank.ranking_proto(body))
    return _json(rerank.ranking_response(answer))
