"""GET /v1/models, GET /v1/models/{id}: the services' models, merged, in the seed's shape."""

from __future__ import annotations

from typing import Any

from fastapi import Request

from edge.errors import model_not_found
from edge.routing import api_router
from tritongate.common.v1 import common_pb2

router = api_router()


def model_object(card: common_pb2.ModelCard) -> dict[str, Any]:
    """OpenAI's Model object plus the seed's (and vLLM's) root/parent/permission and max_model_len."""
    return {
        "id": card.id,
        "object": "model",
        "created": card.created,
        "owned_by": "tritongate",
        "root": card.id,
        "parent": None,
        "max_model_len": card.max_model_len or None,
        "permission": [{
            "id": f"modelperm-{card.id}",
            "object": "model_permission",
            "created": card.created,
            "allow_create_engine": False,
            "allow_sampling": card.kind == "llm",
            "allow_logprobs": card.kind == "llm",
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }],
    }


@router.get("/v1/models", tags=["models"])
async def list_models(request: Request) -> dict[str, Any]:
    cards = await request.app.state.directory.models()
    return {"object": "list", "data": [model_object(card) for card, _ in cards.values()]}


@router.get("/v1/models/{model_id:path}", tags=["models"])
async def retrieve_model(model_id: str, request: Request) -> dict[str, Any]:
    models = await request.app.state.directory.models()
    if model_id not in models:
        raise model_not_found(model_id)
    return model_object(models[model_id][0])
