"""Rerank at /v1/rerank, /v2/rerank, /rerank and NIM's /v1/ranking (the rules and shapes are in
edge/endpoints/rerank.py); lean routes (edge/lean.py)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Request, Response
from pydantic import WithJsonSchema

from edge import deps
from edge.api_router import EITHER_ERRORS, ok, parse_body
from edge.cancel import until_disconnected
from edge.clients import RerankClient
from edge.endpoints import rerank
from edge.errors import tei_body, use_error_body
from edge.lean import lean_router

router = lean_router(tags=["rerank"])


async def _rerank(request: Request, client: RerankClient, body: rerank.RerankRequest, max_documents: int) -> Response:
    answer = await until_disconnected(request, client.rerank(rerank.to_proto(body, max_documents)))
    return Response(orjson.dumps(rerank.response(body, answer)), media_type="application/json")


async def _tei_rerank(request: Request, client: RerankClient, body: rerank.TEIRerankRequest, max_documents: int
                      ) -> Response:
    model = body.model or await client.directory.default(client.service, deps.settings(request).default_rerank_model)
    answer = await until_disconnected(request, client.rerank(rerank.tei_to_proto(body, model, max_documents)))
    return Response(orjson.dumps(rerank.tei_response(body, answer)), media_type="application/json")


@router.post("/v1/rerank", responses=ok(rerank.RerankResponse))
@router.post("/v2/rerank", responses=ok(rerank.RerankResponse))
async def rerank_documents(body: rerank.RerankRequest, request: Request) -> Response:
    return await _rerank(request, deps.clients(request).rerank, body, deps.settings(request).max_rerank_documents)


@router.post("/rerank", responses={**ok(rerank.RerankResponse | rerank.TEIRerankResponse), **EITHER_ERRORS})
async def rerank_any(body: Annotated[dict[str, Any], WithJsonSchema(rerank.EITHER_SCHEMA)], request: Request
                     ) -> Response:
    """RAGFlow posts Denglin's body here without /v1; TEI clients post `texts`."""
    client, settings = deps.clients(request).rerank, deps.settings(request)
    if rerank.is_tei(body):
        use_error_body(request, tei_body)
        tei = parse_body(rerank.TEIRerankRequest, body)
        return await _tei_rerank(request, client, tei, settings.max_rerank_documents)
    return await _rerank(request, client, parse_body(rerank.RerankRequest, body), settings.max_rerank_documents)


@router.post("/v1/ranking", responses=ok(rerank.RankingResponse))
async def rank_passages(body: rerank.RankingRequest, request: Request) -> Response:
    """NVIDIA NIM's reranking API (LangChain's NVIDIARerank posts here)."""
    client = deps.clients(request).rerank
    proto = rerank.ranking_proto(body, deps.settings(request).max_rerank_documents)
    answer = await until_disconnected(request, client.rerank(proto))
    return Response(orjson.dumps(rerank.ranking_response(answer)), media_type="application/json")
