"""POST /tokenize, POST /detokenize (the rules and shapes are in edge/endpoints/tokenize.py)."""

from __future__ import annotations

import orjson
from fastapi import Request, Response

from edge.api_router import api_router, ok
from edge.cancel import until_disconnected
from edge.deps import ClientsDep
from edge.endpoints import tokenize

router = api_router(tags=["tokenize"])


@router.post("/tokenize", responses=ok(tokenize.TokenizeResponse))
async def tokenize_text(body: tokenize.TokenizeRequest, request: Request, clients: ClientsDep) -> Response:
    client = await clients.for_model(body.model)
    answer = await until_disconnected(request, client.tokenize(tokenize.to_proto(body)))
    return Response(orjson.dumps(tokenize.tokenized(answer)), media_type="application/json")


@router.post("/detokenize", responses=ok(tokenize.DetokenizeResponse))
async def detokenize_tokens(body: tokenize.DetokenizeRequest, request: Request, clients: ClientsDep) -> Response:
    client = await clients.for_model(body.model)
    answer = await until_disconnected(request, client.detokenize(tokenize.detokenize_proto(body)))
    return Response(orjson.dumps(tokenize.detokenized(answer)), media_type="application/json")
