"""POST /tokenize (vLLM's body, or TEI's: `inputs`), POST /detokenize (the rules and shapes are in
edge/endpoints/tokenize.py and, TEI's, edge/endpoints/tei.py)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import orjson
from fastapi import Request, Response
from pydantic import WithJsonSchema

from edge.api_router import EITHER_ERRORS, api_router, ok, parse_body
from edge.cancel import until_disconnected
from edge.deps import ClientsDep, SettingsDep
from edge.endpoints import tei, tokenize
from edge.errors import tei_body, use_error_body
from edge.routers.tei import embedding_model

router = api_router(tags=["tokenize"])


EITHER_SCHEMA = {"anyOf": [tokenize.TokenizeRequest.model_json_schema(), tei.TEITokenizeRequest.model_json_schema()]}


@router.post("/tokenize", responses={**ok(tokenize.TokenizeResponse | tei.TEITokenizeResponse), **EITHER_ERRORS})
async def tokenize_any(body: Annotated[dict[str, Any], WithJsonSchema(EITHER_SCHEMA)], request: Request,
                       clients: ClientsDep, settings: SettingsDep) -> Response:
    if tei.is_tei_tokenize(body):
        use_error_body(request, tei_body)
        return await _tei_tokenize(parse_body(tei.TEITokenizeRequest, body), request, clients, settings)
    return await _tokenize(parse_body(tokenize.TokenizeRequest, body), request, clients)


async def _tei_tokenize(body: tei.TEITokenizeRequest, request: Request, clients: ClientsDep,
                        settings: SettingsDep) -> Response:
    """TEI's: each input's tokens with their text, by the default embedding model's tokenizer."""
    model = body.model or await embedding_model(clients, settings)
    client = await clients.for_model(model)
    answers = await until_disconnected(request, asyncio.gather(
        *(client.tokenize(proto) for proto in tei.tokenize_protos(body, model))))
    return Response(orjson.dumps([tei.tokens(answer) for answer in answers]), media_type="application/json")


async def _tokenize(body: tokenize.TokenizeRequest, request: Request, clients: ClientsDep) -> Response:
    client = await clients.for_model(body.model)
    answer = await until_disconnected(request, client.tokenize(tokenize.to_proto(body)))
    return Response(orjson.dumps(tokenize.tokenized(answer)), media_type="application/json")


@router.post("/detokenize", responses=ok(tokenize.DetokenizeResponse))
async def detokenize_tokens(body: tokenize.DetokenizeRequest, request: Request, clients: ClientsDep) -> Response:
    client = await clients.for_model(body.model)
    answer = await until_disconnected(request, client.detokenize(tokenize.detokenize_proto(body)))
    return Response(orjson.dumps(tokenize.detokenized(answer)), media_type="application/json")
