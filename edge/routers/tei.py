"""Hugging Face TEI's GET /info and POST /embed (the rules and shapes are in edge/endpoints/tei.py; its
/rerank is in edge/routers/rerank.py, its /tokenize in edge/routers/tokenize.py). /embed is a lean route
(edge/lean.py); both answer errors in TEI's shape (edge/errors.py)."""

from __future__ import annotations

import orjson
from fastapi import Request, Response

from edge.api_router import TEI_ERRORS, api_router, ok
from edge.app_state import EdgeState, edge_state
from edge.endpoints import tei
from edge.lean import lean_router

router = lean_router(tags=["tei"])
info_router = api_router(tags=["tei"])


async def embedding_model(state: EdgeState) -> str:
    return await state.clients.directory.default(state.clients.embed.service, state.settings.default_embedding_model)


@info_router.get("/info", responses={**ok(tei.TEIInfo), **TEI_ERRORS})
async def model_info(request: Request) -> Response:
    """The default embedding model's, or, where no embedding model is served, the default rerank model's."""
    state = edge_state(request)
    clients, settings = state.clients, state.settings
    directory = clients.directory
    reranks_only = not await directory.of_kind(clients.embed.service) and await directory.of_kind(
        clients.rerank.service)
    if reranks_only:
        model = await directory.default(clients.rerank.service, settings.default_rerank_model)
        card, max_batch = await directory.find(model), settings.max_rerank_documents
    else:
        card, max_batch = await directory.find(await embedding_model(state)), settings.max_embedding_inputs
    return Response(orjson.dumps(tei.info(card, max_batch)), media_type="application/json")


@router.post("/embed", responses={**ok(tei.TEIEmbedResponse), **TEI_ERRORS})
async def embed(body: tei.TEIEmbedRequest, request: Request) -> Response:
    state = edge_state(request)
    model = body.model or await embedding_model(state)
    proto = tei.embed_proto(body, model)
    return Response(tei.embed_json(await state.clients.embed.embed(proto)),
                    media_type="application/json")
