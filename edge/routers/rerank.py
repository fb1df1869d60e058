"""Rerank at /v1/rerank, /v2/rerank and /rerank (the rules and shapes are in edge/endpoints/rerank.py);
lean routes (edge/lean.py)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError, WithJsonSchema

from edge import deps
from edge.api_router import ok
from edge.cancel import until_disconnected
from edge.clients import RerankClient
from edge.endpoints import rerank
from edge.endpoints.common import ParamError
from edge.lean import lean_router

router = lean_router(tags=["rerank"])


def _parse(model: type[BaseModel], body: Any) -> Any:
    """`body` as `model`, failing as FastAPI's own validation of a declared body would."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=body) from None


async def _rerank(request: Request, client: RerankClient, body: rerank.RerankRequest, max_documents: int) -> Response:
    answer = await until_disconnected(request, client.rerank(rerank.to_proto(body, max_documents)))
    return Response(orjson.dumps(rerank.response(body, answer)), media_type="application/json")


async def _tei_rerank(request: Request, client: RerankClient, body: rerank.TEIRerankRequest, max_documents: int
                      ) -> Response:
    model = body.model or await _single_model(client)
    answer = await until_disconnected(request, client.rerank(rerank.tei_to_proto(body, model, max_documents)))
    return Response(orjson.dumps(rerank.tei_response(body, answer)), media_type="application/json")


async def _single_model(client: RerankClient) -> str:
    models = await client.directory.of_kind(client.service)
    if len(models) != 1:
        raise ParamError(f"Name the rerank model in 'model' (available: {', '.join(models) or 'none'}).", "model")
    return models[0]


@router.post("/v1/rerank", responses=ok(rerank.RerankResponse))
@router.post("/v2/rerank", responses=ok(rerank.RerankResponse))
async def rerank_documents(body: rerank.RerankRequest, request: Request) -> Response:
    return await _rerank(request, deps.clients(request).rerank, body, deps.settings(request).max_rerank_documents)


@router.post("/rerank", responses=ok(rerank.RerankResponse | rerank.TEIRerankResponse))
async def rerank_any(body: Annotated[dict[str, Any], WithJsonSchema(rerank.EITHER_SCHEMA)], request: Request
                     ) -> Response:
    """RAGFlow posts Denglin's body here without /v1; TEI clients post `texts`."""
    client, settings = deps.clients(request).rerank, deps.settings(request)
    if rerank.is_tei(body):
        tei = _parse(rerank.TEIRerankRequest, body)
        return await _tei_rerank(request, client, tei, settings.max_rerank_documents)
    return await _rerank(request, client, _parse(rerank.RerankRequest, body), settings.max_rerank_documents)
