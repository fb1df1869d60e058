"""POST /v1/responses, GET /v1/responses/{id} (the rules and shapes are in edge/endpoints/responses.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import api_router, ok, ok_or_stream
from edge.deps import LlmDep, ResponseStoreDep, SettingsDep
from edge.endpoints import responses
from edge.streaming import run

router = api_router(tags=["responses"])


@router.post("/v1/responses", responses=ok_or_stream(responses.Response, responses.ResponseStreamEvent))
async def create_response(body: responses.ResponseRequest, request: Request, llm: LlmDep, store: ResponseStoreDep,
                          settings: SettingsDep) -> Response:
    history = await responses.history(body, store)
    generation = responses.generation_input(body, history)
    recorder = responses.ResponseRecorder(body, history, store)
    return await run(request, llm, generation, recorder, keepalive_s=settings.sse_keepalive_s,
                     framing=recorder.events, persist=recorder.persist)


@router.get("/v1/responses/{response_id}", responses=ok(responses.Response))
async def retrieve_response(response_id: str, store: ResponseStoreDep) -> Response:
    stored = await responses.stored(store, response_id)
    if stored is None:
        raise responses.not_found(response_id)
    return Response(responses.encoded(stored.response), media_type="application/json")
