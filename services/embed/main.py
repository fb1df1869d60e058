"""Wiring of the embed service."""

from __future__ import annotations

from services.common.server import ModelSet, ServiceSpec
from services.common.triton import Triton
from services.embed.embedder import Embedder
from services.embed.servicer import EmbedServicer
from tritongate.config import ModelConfig
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc


def build(config: ModelConfig, triton: Triton) -> ServiceSpec:
    servicer = EmbedServicer(ModelSet(Embedder(entry, triton) for entry in config.embedding))
    return ServiceSpec.of(embed_pb2, "EmbedService", embed_pb2_grpc.add_EmbedServiceServicer_to_server, servicer)
