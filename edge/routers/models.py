"""GET /v1/models, GET /v1/models/{id}: the services' models, merged (shapes in edge/endpoints/models.py)."""

from __future__ import annotations

from typing import Any

from edge.api_router import api_router
from edge.deps import DirectoryDep, SettingsDep
from edge.endpoints import models
from edge.errors import model_not_found

router = api_router(tags=["models"])


@router.get("/v1/models", response_model=models.ListModelsResponse)
async def list_models(directory: DirectoryDep, settings: SettingsDep) -> Any:
    return models.model_list(list((await directory.models()).values()), settings.default_llm)


@router.get("/v1/models/{model_id:path}", response_model=models.Model)
async def retrieve_model(model_id: str, directory: DirectoryDep) -> Any:
    cards = await directory.models()
    if model_id not in cards:
        raise model_not_found(model_id)
    return models.model_object(cards[model_id])
