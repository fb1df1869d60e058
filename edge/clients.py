"""gRPC channels to the services and the model directory that routes requests by model id.

Channels balance over every address the target resolves to (round_robin), re-resolve DNS often so new
replicas are found, and retry idempotent calls on UNAVAILABLE. The app's lifespan owns them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import grpc

from edge.errors import OpenAIError, bad_request, from_grpc, model_not_found
from edge.metrics import current
from services.common.triton import MAX_MESSAGE_BYTES
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2_grpc
from tritongate.llm.v1 import llm_pb2_grpc
from tritongate.logs import request_metadata
from tritongate.rerank.v1 import rerank_pb2_grpc
from tritongate.settings import Settings
from tritongate.tls import ClientTls, client_tls

log = logging.getLogger(__name__)

KINDS = {"llm": "chat/completions", "embedding": "embeddings", "rerank": "rerank"}


def _service_config(service: str, idempotent: list[str]) -> str:
    retry = {
        "maxAttempts": 4,
        "initialBackoff": "0.05s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{"name": [{"service": service, "method": m} for m in idempotent],
                          "retryPolicy": retry}],
    })


def open_channel(target: str, service: str, idempotent: list[str], tls: ClientTls | None = None
                 ) -> grpc.aio.Channel:
    """A channel to one service; over TLS when `tls` is given."""
    options: list[tuple[str, Any]] = [
        ("grpc.service_config", _service_config(service, idempotent)),
        ("grpc.enable_retries", 1),
        ("grpc.dns_min_time_between_resolutions_ms", 1000),
        # A request larger than this is not kept for a retry (default 256 KiB: a big embedding batch).
        ("grpc.per_rpc_retry_buffer_size", 16 * 1024 * 1024),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # The default reconnect backoff grows to 120 s: a service that comes back would go unnoticed that long.
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 2000),
    ]
    if tls is not None:
        return grpc.aio.secure_channel(target, tls.credentials, options=[*options, *tls.options])
    return grpc.aio.insecure_channel(target, options=options)


@dataclass
class Backend:
    """One service as the edge sees it."""

    kind: str
    name: str
    channel: grpc.aio.Channel
    stub: Any
    retry_after_s: int = 1  # what a 429 from this service tells the client

    async def list_models(self, timeout: float) -> list[common_pb2.ModelCard]:
        response = await self.stub.ListModels(common_pb2.ListModelsRequest(), timeout=timeout,
                                              metadata=request_metadata())
        return list(response.models)


@dataclass
class ModelDirectory:
    """Which service serves which model id: the services' ListModels, merged, cached briefly."""

    backends: dict[str, Backend]
    timeout: float
    ttl: float = 5.0
    _cards: dict[str, tuple[common_pb2.ModelCard, Backend]] = field(default_factory=dict)
    _fetched: float = 0.0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _down: set[str] = field(default_factory=set)  # kinds whose service did not answer the last refresh

    async def refresh(self) -> dict[str, tuple[common_pb2.ModelCard, Backend]]:
        """Ask every service concurrently; a service that is down or slow drops out."""
        backends = list(self.backends.values())
        results = await asyncio.gather(*(b.list_models(self.timeout) for b in backends), return_exceptions=True)
        cards: dict[str, tuple[common_pb2.ModelCard, Backend]] = {}
        self._down = {backend.kind for backend, result in zip(backends, results, strict=True)
                      if isinstance(result, BaseException)}
        for backend, result in zip(backends, results, strict=True):
            if isinstance(result, BaseException):
                log.debug("%s service did not list its models: %s", backend.name, result)
                continue
            for card in result:
                cards.setdefault(card.id, (card, backend))
        self._cards, self._fetched = cards, time.monotonic()
        return cards

    async def models(self, max_age: float | None = None) -> dict[str, tuple[common_pb2.ModelCard, Backend]]:
        max_age = self.ttl if max_age is None else max_age
        if time.monotonic() - self._fetched > max_age:
            async with self._lock:
                if time.monotonic() - self._fetched > max_age:
                    await self.refresh()
        return self._cards

    async def find(self, model: str) -> tuple[common_pb2.ModelCard, Backend]:
        found = (await self.models()).get(model) or (await self.models(max_age=0.5)).get(model)
        if found is None:
            raise model_not_found(model)
        return found

    async def route(self, model: Any, kind: str) -> tuple[common_pb2.ModelCard, Backend]:
        """The service for `model`, which must be of `kind`: 404 when unknown, 400 when of another kind,
        503 when unknown while the service for `kind` is down (the model may well be one of its own)."""
        if not isinstance(model, str) or not model:
            raise bad_request("`model` must be a non-empty string.", "model")
        try:
            card, backend = await self.find(model)
        except OpenAIError:
            if kind in self._down:
                raise OpenAIError(503, f"The {self.backends[kind].name} service is unavailable; try again shortly.",
                                  code="service_unavailable") from None
            raise
        if card.kind != kind:
            raise bad_request(f"The model `{model}` is a {KINDS.get(card.kind, card.kind)} model and cannot "
                              f"serve {KINDS[kind]} requests.", "model", "model_not_supported")
        current().model = model
        return card, backend


async def call(backend: Backend, method: str, request: Any, timeout: float) -> Any:
    """A unary call whose failure becomes an OpenAI error; the usage it reports goes to the access log."""
    try:
        response = await getattr(backend.stub, method)(request, timeout=timeout, metadata=request_metadata())
    except grpc.aio.AioRpcError as exc:
        raise from_grpc(exc, backend.name, backend.retry_after_s) from None
    if "usage" in response.DESCRIPTOR.fields_by_name and response.HasField("usage"):
        current().record_usage(response.usage)
    return response


def open_backends(settings: Settings) -> dict[str, Backend]:
    specs = [
        ("llm", "llm", settings.llm_target, "tritongate.llm.v1.LlmService", llm_pb2_grpc.LlmServiceStub,
         ["ListModels"]),
        ("embedding", "embed", settings.embed_target, "tritongate.embed.v1.EmbedService",
         embed_pb2_grpc.EmbedServiceStub, ["Embed", "ListModels"]),
        ("rerank", "rerank", settings.rerank_target, "tritongate.rerank.v1.RerankService",
         rerank_pb2_grpc.RerankServiceStub, ["Rerank", "ListModels"]),
    ]
    backends = {}
    tls = client_tls(settings)
    for kind, name, target, service, stub_class, idempotent in specs:
        channel = open_channel(target, service, idempotent, tls)
        backends[kind] = Backend(kind, name, channel, stub_class(channel), settings.retry_after_s)
    return backends


__all__ = ["Backend", "ModelDirectory", "OpenAIError", "call", "open_backends"]
