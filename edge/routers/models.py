"""GET /v1/models, GET /v1/models/{id}: the services' models, merged (shapes in edge/endpoints/models.py)."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from edge.api_router import api_router
from edge.app_state import edge_state
from edge.endpoints import models
from edge.errors import model_not_found
from edge.keys.caller import caller

router = api_router(tags=["models"])


@router.get("/v1/models", response_model=models.ListModelsResponse)
async def list_models(request: Request) -> Any:
    state = edge_state(request)
    who = caller()
    cards = [card for card in (await state.clients.directory.models()).values() if who is None or who.allows(card.id)]
    return models.model_list(cards, state.settings.default_llm)


@router.get("/v1/models/{model_id:path}", response_model=models.Model)
async def retrieve_model(model_id: str, request: Request) -> Any:
    cards = await edge_state(request).clients.directory.models()
    who = caller()
    if model_id not in cards or (who is not None and not who.allows(model_id)):
        raise model_not_found(model_id)
    return models.model_object(cards[model_id])
