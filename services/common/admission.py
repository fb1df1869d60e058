"""Admission control: a bound on the inference RPCs a service works on at once.

An RPC beyond the bound is refused at once with RESOURCE_EXHAUSTED (the edge answers 429 with
Retry-After) instead of waiting in a queue: under a burst, the requests already admitted finish in
their usual time and memory stays bounded. Nothing waits for a slot, so nothing queues without bound.

grpc's own `maximum_concurrent_rpcs` is not used: it counts every RPC, health checks and reflection
included, so under overload the readiness probes would fail too and the replica would be taken out of
rotation for being busy. Here only the inference methods count (not ListModels), so probes keep working.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection

import grpc

from services.common.metrics import around, method_of
from tritongate.wire import CODE_KEY, OVERLOADED

# ListModels is not inference; the batch RPCs take a slot per request they carry (services/common/items.py).
_NOT_COUNTED = frozenset({"ListModels", "EmbedBatch", "RerankBatch"})


class Admission:
    """Counts RPCs in flight; `enter` refuses one beyond `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0

    def message(self) -> str:
        return (f"The service is at its limit of {self.limit} concurrent requests (max_in_flight); "
                "retry shortly.")

    async def enter(self, context: grpc.aio.ServicerContext) -> None:
        # No await between the check and the increment: the event loop cannot let another RPC in between.
        if self.in_flight >= self.limit:
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.message(), ((CODE_KEY, OVERLOADED),))
        self.in_flight += 1

    def try_enter(self) -> bool:
        """Take a slot if there is one (for a request inside a shared RPC: services/common/items.py)."""
        if self.in_flight >= self.limit:
            return False
        self.in_flight += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1

    def slot(self, context: grpc.aio.ServicerContext) -> _Slot:
        return _Slot(self, context)


class _Slot:
    """One admitted RPC: taken on entry (or refused), given back on exit."""

    __slots__ = ("admission", "context")

    def __init__(self, admission: Admission, context: grpc.aio.ServicerContext) -> None:
        self.admission, self.context = admission, context

    async def __aenter__(self) -> None:
        await self.admission.enter(self.context)

    async def __aexit__(self, *exc: object) -> None:
        self.admission.leave()


class AdmissionInterceptor(grpc.aio.ServerInterceptor):
    """Bounds the unary and server-streaming RPCs of `services` (full gRPC service names), except
    ListModels; every other service of the server (health, reflection) passes untouched."""

    def __init__(self, limit: int, services: Collection[str]) -> None:
        self.admission = Admission(limit)
        self.services = frozenset(services)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        service, method = method_of(handler_call_details)
        if handler is None or service not in self.services or method in _NOT_COUNTED or handler.request_streaming:
            return handler
        return around(handler, self.admission.slot)
