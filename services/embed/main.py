"""Wiring of the embed service."""

from __future__ import annotations

from services.common.server import ModelSet, ServiceSpec
from services.common.triton import Triton
from services.embed.embedder import Embedder
from services.embed.servicer import EmbedServicer
from tritongate.config import ModelConfig
from tritongate.registry import EMBED


def build(config: ModelConfig, triton: Triton) -> ServiceSpec:
    return ServiceSpec(EMBED, EmbedServicer(ModelSet(Embedder(entry, triton) for entry in config.embedding)))
