"""Wiring of the rerank service."""

from __future__ import annotations

from services.common.server import ModelSet, ServiceSpec
from services.common.triton import Triton
from services.rerank.reranker import Reranker
from services.rerank.servicer import RerankServicer
from tritongate.config import ModelConfig
from tritongate.rerank.v1 import rerank_pb2, rerank_pb2_grpc


def build(config: ModelConfig, triton: Triton) -> ServiceSpec:
    servicer = RerankServicer(ModelSet(Reranker(entry, triton) for entry in config.rerank))
    return ServiceSpec.of(rerank_pb2, "RerankService", rerank_pb2_grpc.add_RerankServiceServicer_to_server, servicer)
