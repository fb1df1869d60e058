"""POST /v1/chat/completions (the rules and shapes are in edge/endpoints/chat.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import api_router, ok_or_stream
from edge.deps import LlmDep, SettingsDep
from edge.endpoints import chat
from edge.streaming import generate

router = api_router()


@router.post("/v1/chat/completions", tags=["chat"],
             responses=ok_or_stream(chat.ChatCompletion, chat.ChatCompletionChunk))
async def create_chat_completion(body: chat.ChatCompletionRequest, request: Request, llm: LlmDep,
                                 settings: SettingsDep) -> Response:
    return await generate(request, llm, chat.generation_input(body), chat.shape(body, settings.reasoning_field),
                          include_usage=body.include_usage, keepalive_s=settings.sse_keepalive_s)
