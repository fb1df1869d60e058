"""POST /v1/completions (the rules and shapes are in edge/endpoints/completions.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import api_router, ok_or_stream
from edge.deps import LlmDep, SettingsDep
from edge.endpoints import completions
from edge.streaming import generate

router = api_router()


@router.post("/v1/completions", tags=["completions"],
             responses=ok_or_stream(completions.Completion, completions.Completion))
async def create_completion(body: completions.CompletionRequest, request: Request, llm: LlmDep,
                            settings: SettingsDep) -> Response:
    return await generate(request, llm, completions.generation_input(body), completions.shape(body),
                          include_usage=body.include_usage, keepalive_s=settings.sse_keepalive_s)
