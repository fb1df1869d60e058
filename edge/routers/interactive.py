"""POST /v1/chat/interactive (the rules, sessions, turns and shapes are in edge/endpoints/interactive.py); a
lean route (edge/lean.py)."""

from __future__ import annotations

from fastapi import Request, Response

from edge.app_state import edge_state
from edge.endpoints import interactive
from edge.lean import lean_router

router = lean_router(tags=["interactive"])


@router.post("/v1/chat/interactive", responses=interactive.RESPONSES)
async def chat_interactive(body: interactive.InteractiveRequest, request: Request) -> Response:
    state = edge_state(request)
    if body.cancel:
        return interactive.json_answer(await interactive.cancel(body, state.sessions))
    llm = state.clients.llm
    model = body.model or await llm.directory.default(llm.service, state.settings.default_llm)
    await llm.directory.route(model, llm.service)  # before a session is opened for it
    session_id, session = await interactive.session_for(body, state.sessions, model,
                                                        state.settings.interactive_max_session_tokens)
    if interactive.ends_session(body):
        await state.sessions.conversations.delete(str(session_id))
        return interactive.json_answer(interactive.answer("", session_id, history_tokens=session.tokens))
    turn = interactive.Turn(body, session_id, session, state.sessions, state.settings.request_timeout_s)
    return await turn.run(request, interactive.generation_input(body, session))
