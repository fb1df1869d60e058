"""POST /tokenize (vLLM's body, or TEI's: `inputs`), POST /detokenize (the rules and shapes are in
edge/endpoints/tokenize.py and, TEI's, edge/endpoints/tei.py); lean routes (edge/lean.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import orjson
from fastapi import Request, Response
from pydantic import WithJsonSchema

from edge.api_router import EITHER_ERRORS, ok
from edge.app_state import edge_state
from edge.endpoints import tei, tokenize
from edge.lean import lean_router
from edge.routers.tei import embedding_model

router = lean_router(tags=["tokenize"])


def _json(payload: Any) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/tokenize", responses={**ok(tokenize.TokenizeResponse | tei.TEITokenizeResponse), **EITHER_ERRORS})
async def tokenize_any(body: Annotated[dict[str, Any], WithJsonSchema(tokenize.EITHER_SCHEMA)], request: Request
                       ) -> Response:
    parsed = tokenize.either_request(body, request)
    clients = edge_state(request).clients
    if isinstance(parsed, tokenize.TokenizeRequest):
        client = await clients.for_model(parsed.model)
        return _json(tokenize.tokenized(await client.tokenize(tokenize.to_proto(parsed))))
    # TEI's: each input's tokens with their text, by the default embedding model's tokenizer.
    model = parsed.model or await embedding_model(edge_state(request))
    client = await clients.for_model(model)
    answers = await asyncio.gather(
        *(client.tokenize(proto) for proto in tei.tokenize_protos(parsed, model)))
    return _json([tei.tokens(answer) for answer in answers])


@router.post("/detokenize", responses=ok(tokenize.DetokenizeResponse))
async def detokenize_tokens(body: tokenize.DetokenizeRequest, request: Request) -> Response:
    client = await edge_state(request).clients.for_model(body.model)
    answer = await client.detokenize(tokenize.detokenize_proto(body))
    return _json(tokenize.detokenized(answer))
