"""POST /v1/responses, GET /v1/responses/{id} (the rules are in edge/endpoints/responses.py, the answers in
edge/endpoints/response_output.py); POST is a lean route (edge/lean.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.api_router import api_router, ok, ok_or_stream
from edge.app_state import edge_state
from edge.endpoints import response_output, response_schemas, responses
from edge.lean import lean_router
from edge.streaming import Answer, run

router = lean_router(tags=["responses"])
stored_router = api_router(tags=["responses"])


@router.post("/v1/responses",
             responses=ok_or_stream(response_schemas.Response, response_schemas.ResponseStreamEvent))
async def create_response(body: responses.ResponseRequest, request: Request) -> Response:
    store = edge_state(request).responses
    history = await responses.history(body, store)
    recorder = response_output.ResponseRecorder(body, history, store)
    return await run(request, responses.generation_input(body, history),
                     Answer(recorder, recorder.events, respond=recorder.event_stream, persist=recorder.persist))


@stored_router.get("/v1/responses/{response_id}", responses=ok(response_schemas.Response))
async def retrieve_response(response_id: str, request: Request) -> Response:
    stored = await responses.stored(edge_state(request).responses, response_id)
    if stored is None:
        raise responses.not_found(response_id)
    return Response(responses.encoded(stored.response), media_type="application/json")
