"""Admission control: a bound on the inference RPCs a service works on at once.

An RPC beyond the bound is refused at once with RESOURCE_EXHAUSTED (the edge answers 429 with
Retry-After) instead of waiting in a queue: under a burst, the requests already admitted finish in
their usual time and memory stays bounded. Nothing waits for a slot, so nothing queues without bound.

grpc's own `maximum_concurrent_rpcs` is not used: it counts every RPC, health checks and reflection
included, so under overload the readiness probes would fail too and the replica would be taken out of
rotation for being busy. Here only the inference methods count (not ListModels), so probes keep working.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any

import grpc

from services.common.errors import CODE_KEY

OVERLOADED = "overloaded"
_NOT_COUNTED = frozenset({"ListModels"})


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

    def leave(self) -> None:
        self.in_flight -= 1


def _bounded(behavior: Callable[..., Any], admission: Admission) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await admission.enter(context)
            try:
                async for response in behavior(request, context):
                    yield response
            finally:
                admission.leave()

        return stream

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        await admission.enter(context)
        try:
            return await behavior(request, context)
        finally:
            admission.leave()

    return unary


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
        service, _, method = handler_call_details.method.lstrip("/").rpartition("/")
        if handler is None or service not in self.services or method in _NOT_COUNTED or handler.request_streaming:
            return handler
        factory: Callable[..., grpc.RpcMethodHandler] = (
            grpc.unary_stream_rpc_method_handler if handler.response_streaming else grpc.unary_unary_rpc_method_handler)
        behavior = getattr(handler, "unary_stream" if handler.response_streaming else "unary_unary")
        return factory(_bounded(behavior, self.admission), request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)
