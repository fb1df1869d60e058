"""POST /v1/chat/interactive (the rules, sessions and shapes are in edge/endpoints/interactive.py)."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import Request, Response

from edge.api_router import api_router
from edge.deps import LlmDep, SessionsDep, SettingsDep
from edge.endpoints import interactive
from edge.streaming import run

router = api_router(tags=["interactive"])


def _json(payload: dict[str, object]) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/chat/interactive", responses=interactive.RESPONSES)
async def chat_interactive(body: interactive.InteractiveRequest, request: Request, llm: LlmDep,
                           sessions: SessionsDep, settings: SettingsDep) -> Response:
    if body.cancel:
        return _json(await interactive.cancel(body, sessions))
    model = body.model or await llm.directory.default(llm.service, settings.default_llm)
    await llm.directory.route(model, llm.service)  # before a session is opened for it
    session_id, session = await interactive.session_for(body, sessions, model,
                                                        settings.interactive_max_session_tokens)
    if interactive.ends_session(body):
        await sessions.conversations.delete(str(session_id))
        return _json(interactive.answer("", session_id, history_tokens=session.tokens))
    generation = interactive.generation_input(body, session)
    turn = interactive.Turn(body, session_id, session, sessions, settings.request_timeout_s)
    await turn.begin()
    try:
        response = await run(request, llm, generation, turn, keepalive_s=settings.sse_keepalive_s,
                             framing=turn.lines, respond=interactive.json_lines(turn), persist=turn.persist)
    except asyncio.CancelledError:
        turn.close()
        task = asyncio.current_task()
        if not turn.cancelled or task is None:
            raise  # the client went away
        task.uncancel()
        return _json(interactive.answer("", session_id, history_tokens=session.tokens))
    except BaseException:
        turn.close()
        raise
    if not body.stream:  # a stream's lines close the turn when they end
        turn.close()
    return response
