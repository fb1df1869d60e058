"""POST /v1/chat/completions (the rules and shapes are in edge/endpoints/chat.py); a lean route (edge/lean.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import ok_or_stream
from edge.app_state import edge_state
from edge.endpoints import chat
from edge.lean import lean_router
from edge.streaming import generate

router = lean_router()


@router.post("/v1/chat/completions", tags=["chat"],
             responses=ok_or_stream(chat.ChatCompletion, chat.ChatCompletionChunk))
async def create_chat_completion(body: chat.ChatCompletionRequest, request: Request) -> Response:
    return await generate(request, chat.generation_input(body),
                          chat.shape(body, edge_state(request).settings.reasoning_field), body.include_usage)
