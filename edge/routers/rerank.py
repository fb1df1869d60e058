"""Rerank at /v1/rerank, /rerank and /v2/rerank: the seed's shape, with Cohere/Jina's `results` too;
a body with `texts` at /rerank is TEI's API and gets TEI's answer."""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError, WithJsonSchema

from edge.cancel import until_disconnected
from edge.clients import call
from edge.errors import bad_request
from edge.protocol.rerank import RerankRequest, TEIRerankRequest
from edge.routing import api_router
from tritongate.rerank.v1 import rerank_pb2

router = api_router(tags=["rerank"])
# /rerank takes either body; /openapi.json declares both.
EITHER_SCHEMA = {"anyOf": [RerankRequest.model_json_schema(), TEIRerankRequest.model_json_schema()]}


async def _rerank(request: Request, model: Any, proto: rerank_pb2.RerankRequest) -> rerank_pb2.RerankResponse:
    state = request.app.state
    limit = state.settings.max_rerank_documents
    if len(proto.documents) > limit:
        raise bad_request(f"'documents' has {len(proto.documents)} items; at most {limit} are allowed.",
                          "documents")
    _, backend = await state.directory.route(model, "rerank")
    proto.model = model
    return await until_disconnected(request, call(backend, "Rerank", proto, state.settings.unary_timeout_s))


def _parse(model_class: type[Any], body: Any) -> Any:
    try:
        return model_class.model_validate(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False, include_context=False)]
        raise RequestValidationError(errors, body=body) from None


async def seed_rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    top_n = min(body.top_n or 0, len(body.documents))  # more than there are documents: all of them
    proto = rerank_pb2.RerankRequest(query=body.query, documents=body.documents, top_n=top_n)
    response = await _rerank(request, body.model, proto)
    results = []
    for result in response.results:
        entry: dict[str, Any] = {"object": "rerank", "index": result.index, "relevance_score": result.score}
        if body.return_documents:
            entry["document"] = {"text": body.documents[result.index]}
        results.append(entry)
    usage = response.usage
    return {
        "id": f"rerank-{uuid.uuid4().hex}",
        "object": "list",
        "model": response.model,
        "data": results,
        "results": results,
        "usage": {"prompt_tokens": usage.prompt_tokens, "total_tokens": usage.total_tokens,
                  "completion_tokens": 0},
    }


async def tei_rerank(body: TEIRerankRequest, request: Request) -> list[dict[str, Any]]:
    """TEI names no model; with several rerank models configured, `model` picks one."""
    model = body.model or await _single_rerank_model(request)
    proto = rerank_pb2.RerankRequest(query=body.query, documents=body.texts, raw_scores=body.raw_scores,
                                     truncate=body.truncate)
    response = await _rerank(request, model, proto)
    return [{"index": r.index, "score": r.score, **({"text": body.texts[r.index]} if body.return_text else {})}
            for r in response.results]


async def _single_rerank_model(request: Request) -> str:
    models = [card.id for card, _ in (await request.app.state.directory.models()).values() if card.kind == "rerank"]
    if len(models) != 1:
        raise bad_request(f"Name the rerank model in 'model' (available: {', '.join(models) or 'none'}).", "model")
    return models[0]


@router.post("/v1/rerank")
@router.post("/v2/rerank")
async def rerank(body: RerankRequest, request: Request) -> dict[str, Any]:
    return await seed_rerank(body, request)


@router.post("/rerank")
async def rerank_any(body: Annotated[dict[str, Any], WithJsonSchema(EITHER_SCHEMA)], request: Request) -> Any:
    """RAGFlow posts the seed's body here without /v1; TEI clients post `texts`."""
    if "texts" in body and "documents" not in body:
        return await tei_rerank(_parse(TEIRerankRequest, body), request)
    return await seed_rerank(_parse(RerankRequest, body), request)
