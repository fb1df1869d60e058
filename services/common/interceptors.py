"""How the services' server interceptors wrap a method handler: each says what runs around an RPC (an
async context manager given the RPC's context), and `around` rebuilds the handler with it."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import grpc

Scope = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]

# (request streaming, response streaming) → the handler's type label, its behaviour attribute, its factory.
_KINDS = {
    (False, False): ("unary", "unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("server_stream", "unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("client_stream", "stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("bidi_stream", "stream_stream", grpc.stream_stream_rpc_method_handler),
}


def method_of(details: grpc.HandlerCallDetails) -> tuple[str, str]:
    """("tritongate.embed.v1.EmbedService", "Embed") from "/tritongate.embed.v1.EmbedService/Embed"."""
    service, _, method = details.method.lstrip("/").rpartition("/")
    return service, method


def kind_of(handler: grpc.RpcMethodHandler) -> str:
    return _KINDS[(handler.request_streaming, handler.response_streaming)][0]


def around(handler: grpc.RpcMethodHandler, scope: Scope) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour run inside `scope(context)`."""
    _, attribute, factory = _KINDS[(handler.request_streaming, handler.response_streaming)]
    behavior = getattr(handler, attribute)
    wrapped: Callable[..., Any]
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with scope(context):
                async for response in behavior(request, context):
                    yield response

        wrapped = stream
    else:

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with scope(context):
                return await behavior(request, context)

        wrapped = unary
    return factory(wrapped, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)
