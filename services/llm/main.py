"""Wiring of the llm service."""

from __future__ import annotations

from services.common.server import ModelSet, ServiceSpec
from services.common.triton import Triton
from services.llm.model import LanguageModel
from services.llm.servicer import LlmServicer
from tritongate.config import ModelConfig
from tritongate.registry import LLM


def build(config: ModelConfig, triton: Triton) -> ServiceSpec:
    models = ModelSet(LanguageModel(entry, config.model_info(entry.name), triton) for entry in config.llm)
    return ServiceSpec(LLM, LlmServicer(models))
