"""POST /v1/messages, POST /v1/messages/count_tokens (the rules and shapes are in edge/endpoints/messages.py;
errors on these routes have Anthropic's shape, edge/errors.py)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request, Response

from edge.api_router import SSE_EVENT, api_router, errors_of, ok
from edge.cancel import until_disconnected
from edge.deps import LlmDep, SettingsDep
from edge.endpoints import messages
from edge.sse import sse_response
from edge.streaming import run
from tritongate.common.v1 import tokenizer_pb2

router = api_router(errors=errors_of(messages.AnthropicError), tags=["messages"])
STREAMED: dict[int | str, dict[str, Any]] = {200: {
    "model": messages.Message, "content": {"text/event-stream": {"schema": SSE_EVENT}},
    "description": "A Message, or with `stream: true` Server-Sent Events whose `data` is a MessageStreamEvent"}}


@router.post("/v1/messages", responses=STREAMED)
async def create_message(body: messages.MessagesRequest, request: Request, llm: LlmDep,
                         settings: SettingsDep) -> Response:
    shape = messages.MessageShape()
    return await run(request, llm, messages.generation_input(body), shape, keepalive_s=settings.sse_keepalive_s,
                     framing=shape.events, respond=lambda events, keepalive_s: sse_response(events, keepalive_s,
                                                                                           done=b""))


@router.post("/v1/messages/count_tokens", responses=ok(messages.TokenCount))
async def count_tokens(body: messages.CountTokensRequest, request: Request, llm: LlmDep) -> Response:
    generation = messages.generation_input(body).proto()
    answer = await until_disconnected(request, llm.tokenize(tokenizer_pb2.TokenizeRequest(
        model=body.model, generation=generation)))
    return Response(orjson.dumps(messages.token_count(len(answer.tokens))), media_type="application/json")
