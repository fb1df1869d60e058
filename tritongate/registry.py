"""The services, in one table: every part that starts, configures, probes or calls a service (the CLI,
the launcher, the settings, the health probe, the services' runner and the edge) reads it here.

A service's `name` is the one word used for it everywhere: its CLI command, its settings
(TRITONGATE_<NAME>_PORT, TRITONGATE_<NAME>_TARGET), its log and health names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

import grpc

from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc
from tritongate.rerank.v1 import rerank_pb2, rerank_pb2_grpc

ModelKind: TypeAlias = common_pb2.ModelKind.ValueType


@dataclass(frozen=True)
class ServiceInfo:
    """One gRPC service of tritongate."""

    name: str  # the one word for it
    kind: ModelKind  # the kind of model it serves
    serves: str  # what that kind of model is for, in error messages ("... cannot serve embeddings requests")
    section: str  # its section of the model configuration file
    grpc_service: str  # full gRPC service name (health, reflection, admission control)
    stub: Callable[[grpc.aio.Channel], Any]  # the generated client stub class
    add_servicer: Callable[[Any, grpc.aio.Server], None]  # the generated server registration
    builder: str  # module whose build(config, triton) returns the service's ServiceSpec
    default_port: int
    idempotent: tuple[str, ...]  # methods the edge retries on UNAVAILABLE (Generate only before its first token)


def _full_name(pb2: Any, service: str) -> str:
    return str(pb2.DESCRIPTOR.services_by_name[service].full_name)


LLM = ServiceInfo("llm", common_pb2.MODEL_KIND_LLM, "chat/completions", "llm", _full_name(llm_pb2, "LlmService"),
                  llm_pb2_grpc.LlmServiceStub, llm_pb2_grpc.add_LlmServiceServicer_to_server, "services.llm.main",
                  50051, ("ListModels",))
EMBED = ServiceInfo("embed", common_pb2.MODEL_KIND_EMBEDDING, "embeddings", "embedding",
                    _full_name(embed_pb2, "EmbedService"), embed_pb2_grpc.EmbedServiceStub,
                    embed_pb2_grpc.add_EmbedServiceServicer_to_server, "services.embed.main", 50052,
                    ("Embed", "EmbedBatch", "ListModels"))
RERANK = ServiceInfo("rerank", common_pb2.MODEL_KIND_RERANK, "rerank", "rerank",
                     _full_name(rerank_pb2, "RerankService"), rerank_pb2_grpc.RerankServiceStub,
                     rerank_pb2_grpc.add_RerankServiceServicer_to_server, "services.rerank.main", 50053,
                     ("Rerank", "RerankBatch", "ListModels"))

SERVICES: tuple[ServiceInfo, ...] = (LLM, EMBED, RERANK)
NAMES: tuple[str, ...] = tuple(service.name for service in SERVICES)
BY_NAME: dict[str, ServiceInfo] = {service.name: service for service in SERVICES}
BY_KIND: dict[ModelKind, ServiceInfo] = {service.kind: service for service in SERVICES}
