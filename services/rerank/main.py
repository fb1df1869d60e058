"""Wiring of the rerank service."""

from __future__ import annotations

from services.common.server import ModelSet, ServiceSpec
from services.common.triton import Triton
from services.rerank.reranker import Reranker
from services.rerank.servicer import RerankServicer
from tritongate.config import ModelConfig
from tritongate.registry import RERANK


def build(config: ModelConfig, triton: Triton) -> ServiceSpec:
    return ServiceSpec(RERANK, RerankServicer(ModelSet(Reranker(entry, triton) for entry in config.rerank)))
