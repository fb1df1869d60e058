"""The model directory: which service serves which model id. Every call of an edge client
(edge/clients.py) routes its model here first (`ModelDirectory.route`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from edge.errors import OpenAIError, bad_request, model_not_found
from tritongate.common.v1 import common_pb2
from tritongate.registry import BY_KIND, ServiceInfo

if TYPE_CHECKING:
    from edge.clients import ServiceClient

log = logging.getLogger(__name__)


class ModelDirectory:
    """Which service serves which model id: the services' ListModels, merged, cached briefly."""

    def __init__(self, timeout: float, ttl: float = 5.0, retry_after_s: int = 1) -> None:
        self.clients: list[ServiceClient] = []  # each client adds itself
        self.timeout = timeout
        self.ttl = ttl
        self.retry_after_s = retry_after_s  # what a 503 for a service that is down tells the client
        self._cards: dict[str, common_pb2.ModelCard] = {}
        self._fetched = 0.0
        self._lock = asyncio.Lock()
        self._down: set[str] = set()  # services that did not answer the last refresh

    async def refresh(self) -> dict[str, common_pb2.ModelCard]:
        """Ask every service concurrently; a service that is down or slow drops out."""
        clients = list(self.clients)
        results = await asyncio.gather(*(c.list_models(self.timeout) for c in clients), return_exceptions=True)
        cards: dict[str, common_pb2.ModelCard] = {}
        self._down = set()
        for client, result in zip(clients, results, strict=True):
            if isinstance(result, BaseException):
                self._down.add(client.service.name)
                log.debug("%s service did not list its models: %s", client.service.name, result)
                continue
            for card in result:
                cards.setdefault(card.id, card)
        self._cards, self._fetched = cards, time.monotonic()
        return cards

    async def models(self, max_age: float | None = None) -> dict[str, common_pb2.ModelCard]:
        max_age = self.ttl if max_age is None else max_age
        if time.monotonic() - self._fetched > max_age:
            async with self._lock:
                if time.monotonic() - self._fetched > max_age:
                    await self.refresh()
        return self._cards

    async def of_kind(self, service: ServiceInfo) -> list[str]:
        return [card.id for card in (await self.models()).values() if card.kind == service.kind]

    async def default(self, service: ServiceInfo, configured: str | None) -> str:
        """The model of a request that names none: `configured` (the edge's setting) when set, else the
        first model `service` lists."""
        if configured:
            return configured
        models = await self.of_kind(service)
        if not models:
            self._raise_if_down(service)
            raise OpenAIError(404, f"The {service.name} service serves no model.", "model", "model_not_found")
        return models[0]

    async def find(self, model: str) -> common_pb2.ModelCard:
        found = (await self.models()).get(model) or (await self.models(max_age=0.5)).get(model)
        if found is None:
            raise model_not_found(model)
        return found

    def _raise_if_down(self, service: ServiceInfo) -> None:
        if service.name in self._down:
            raise OpenAIError(503, f"The {service.name} service is unavailable; try again shortly.",
                              code="service_unavailable", headers={"Retry-After": str(self.retry_after_s)}) from None

    async def route(self, model: Any, service: ServiceInfo) -> common_pb2.ModelCard:
        """The card of `model`, which `service` must serve: 404 when unknown, 400 when another service's,
        503 when unknown while `service` is down (the model may well be one of its own)."""
        if not isinstance(model, str) or not model:
            raise bad_request("`model` must be a non-empty string.", "model")
        try:
            card = await self.find(model)
        except OpenAIError:
            self._raise_if_down(service)
            raise
        if card.kind != service.kind:
            other = BY_KIND[card.kind].serves if card.kind in BY_KIND else "different"
            raise bad_request(f"The model `{model}` is a {other} model and cannot serve {service.serves} requests.",
                              "model", "model_not_supported")
        return card
