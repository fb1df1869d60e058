"""POST /v1/chat/interactive (the rules, sessions and shapes are in edge/endpoints/interactive.py)."""

from __future__ import annotations

import asyncio

import orjson
from fastapi import Request, Response

from edge.api_router import api_router
from edge.clients import LlmClient
from edge.deps import LlmDep, SessionsDep, SettingsDep
from edge.endpoints import chat, interactive
from edge.endpoints.as_chat import chat_params_renamed
from edge.endpoints.common import ParamError
from edge.streaming import run

router = api_router(tags=["interactive"])


async def _single_llm(llm: LlmClient) -> str:
    models = await llm.directory.of_kind(llm.service)
    if len(models) != 1:
        raise ParamError(f"Name the model in 'model' (available: {', '.join(models) or 'none'}).", "model")
    return models[0]


def _json(payload: dict[str, object]) -> Response:
    return Response(orjson.dumps(payload), media_type="application/json")


@router.post("/v1/chat/interactive", responses=interactive.RESPONSES)
async def chat_interactive(body: interactive.InteractiveRequest, request: Request, llm: LlmDep,
                           sessions: SessionsDep, settings: SettingsDep) -> Response:
    if body.cancel:
        return _json(await interactive.cancel(body, sessions))
    model = body.model or await _single_llm(llm)
    session_id, session = await interactive.session_for(body, sessions, model,
                                                        settings.interactive_max_session_tokens)
    if interactive.ends_session(body):
        await sessions.conversations.delete(str(session_id))
        return _json(interactive.answer("", session_id, history_tokens=session.tokens))
    proto = chat.to_proto(interactive.to_chat(body, session))
    turn = interactive.Turn(body, session_id, session, sessions, settings.request_timeout_s)
    await turn.begin()
    try:
        with chat_params_renamed(interactive.INTERACTIVE_PARAM):
            response = await run(request, llm, proto, turn, stream=body.stream, keepalive_s=settings.sse_keepalive_s,
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
