"""POST /v1/completions (the rules and shapes are in edge/endpoints/completions.py); a lean route (edge/lean.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import ok_or_stream
from edge.endpoints import completions
from edge.lean import lean_router
from edge.streaming import generate

router = lean_router()


@router.post("/v1/completions", tags=["completions"],
             responses=ok_or_stream(completions.Completion, completions.Completion))
async def create_completion(body: completions.CompletionRequest, request: Request) -> Response:
    return await generate(request, completions.generation_input(body), completions.shape(body), body.include_usage)
