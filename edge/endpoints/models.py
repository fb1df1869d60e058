"""GET /v1/models and /v1/models/{id}: OpenAI's Model object plus the `root`, `parent`, `permission`
and `max_model_len` that Denglin's openai_api (and vLLM) add, and tritongate's `image_input`, `max_beams` and
`reasoning`; a LoRA adapter is a model of its own whose `parent` is its base model, as vLLM lists them."""

from __future__ import annotations

from typing import Any, Literal

from edge.endpoints.common import ResponseModel
from tritongate.common.v1 import common_pb2


class ModelPermission(ResponseModel):
    id: str
    object: Literal["model_permission"]
    created: int
    allow_create_engine: bool
    allow_sampling: bool
    allow_logprobs: bool
    allow_search_indices: bool
    allow_view: bool
    allow_fine_tuning: bool
    organization: str
    group: str | None
    is_blocking: bool


class Model(ResponseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: str | None
    max_model_len: int | None
    image_input: bool  # whether the model takes images in chat messages (image_url / input_image parts)
    max_beams: int | None  # LLMs: most beams of beam search (`num_beams`), 0 for none
    reasoning: bool | None  # LLMs: whether its thinking is parsed out (`reasoning_content`)
    permission: list[ModelPermission]


class ListModelsResponse(ResponseModel):
    object: Literal["list"]
    data: list[Model]


def model_object(card: common_pb2.ModelCard) -> dict[str, Any]:
    generates = card.kind == common_pb2.MODEL_KIND_LLM
    return {
        "id": card.id,
        "object": "model",
        "created": card.created,
        "owned_by": "tritongate",
        "root": card.id,
        "parent": card.parent or None,  # a LoRA adapter's base model
        "max_model_len": card.max_model_len or None,
        "image_input": card.image_input,
        "max_beams": card.max_beams if generates else None,
        "reasoning": card.reasoning if generates else None,
        "permission": [{
            "id": f"modelperm-{card.id}",
            "object": "model_permission",
            "created": card.created,
            "allow_create_engine": False,
            "allow_sampling": generates,
            "allow_logprobs": generates,
            "allow_search_indices": False,
            "allow_view": True,
            "allow_fine_tuning": False,
            "organization": "*",
            "group": None,
            "is_blocking": False,
        }],
    }


def model_list(cards: list[common_pb2.ModelCard], first: str | None = None) -> dict[str, Any]:
    """The models, `first` (the default LLM) ahead of the others, for clients that pick the first listed."""
    ordered = sorted(cards, key=lambda card: card.id != first)  # stable: otherwise the services' order
    return {"object": "list", "data": [model_object(card) for card in ordered]}
