"""POST /v1/messages, POST /v1/messages/count_tokens (the rules and the answers are in edge/endpoints/messages.py;
errors on these routes have Anthropic's shape, edge/errors.py); lean routes (edge/lean.py)."""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import Request, Response

from edge.api_router import SSE_EVENT, errors_of, ok
from edge.app_state import edge_state
from edge.endpoints import message_schemas, messages
from edge.lean import lean_router
from edge.streaming import Answer, run
from tritongate.common.v1 import tokenizer_pb2

router = lean_router(errors=errors_of(message_schemas.AnthropicError), tags=["messages"])
STREAMED: dict[int | str, dict[str, Any]] = {200: {
    "model": message_schemas.Message, "content": {"text/event-stream": {"schema": SSE_EVENT}},
    "description": "A Message, or with `stream: true` Server-Sent Events whose `data` is a MessageStreamEvent"}}


@router.post("/v1/messages", responses=STREAMED)
async def create_message(body: messages.MessagesRequest, request: Request) -> Response:
    shape = messages.answer_shape(body)
    return await run(request, messages.generation_input(body),
                     Answer(shape, shape.events, respond=messages.event_stream))


@router.post("/v1/messages/count_tokens", responses=ok(message_schemas.TokenCount))
async def count_tokens(body: messages.CountTokensRequest, request: Request) -> Response:
    proto = tokenizer_pb2.TokenizeRequest(model=body.model, generation=messages.generation_input(body).proto())
    answer = await edge_state(request).clients.llm.tokenize(proto)
    return Response(orjson.dumps(messages.token_count(len(answer.tokens))), media_type="application/json")
