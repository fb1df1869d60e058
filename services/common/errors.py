"""How services report failures: one exception type carrying a gRPC code and the offending parameter.

The edge turns these into OpenAI error bodies in one table (edge/errors.py); the parameter travels in
the PARAM_KEY trailing metadata and an OpenAI error `code` (e.g. "model_not_found") in CODE_KEY (both
keys in tritongate/wire.py, which the edge reads too).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from tritongate.common.v1 import common_pb2
from tritongate.wire import CODE_KEY, PARAM_KEY

log = logging.getLogger(__name__)


class ServiceError(Exception):
    """A failure the client should see, with a gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str, param: str | None = None,
                 error_code: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.error_code = error_code

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        pairs = ((PARAM_KEY, self.param), (CODE_KEY, self.error_code))
        return tuple((key, value) for key, value in pairs if value)


def invalid_argument(message: str, param: str | None = None) -> ServiceError:
    return ServiceError(grpc.StatusCode.INVALID_ARGUMENT, message, param)


def model_not_found(model: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.NOT_FOUND, f"The model `{model}` does not exist.", "model",
                        "model_not_found")


F = TypeVar("F", bound=Callable[..., Any])


# Failures on this side (not the client's mistakes): logged, so the request id ties them to the edge's 5xx.
_LOGGED = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                     grpc.StatusCode.FAILED_PRECONDITION})


def item_error(exc: BaseException) -> common_pb2.ItemError:
    """The status an RPC failing with `exc` would have ended with, as the message that carries it where one
    call serves several requests (the batch RPCs, GenerateMany); logged as `rpc` logs it."""
    if isinstance(exc, ServiceError):
        if exc.code in _LOGGED:
            log.warning("%s: %s", exc.code.name, exc.message)
        return common_pb2.ItemError(code=exc.code.value[0], message=exc.message, param=exc.param or "",
                                    error_code=exc.error_code or "")
    log.error("unexpected error in %s", type(exc).__name__, exc_info=exc)
    return common_pb2.ItemError(code=grpc.StatusCode.INTERNAL.value[0],
                                message="internal error in the service; see its log")


async def _abort(context: grpc.aio.ServicerContext, exc: Exception) -> None:
    if isinstance(exc, ServiceError):
        if exc.code in _LOGGED:
            log.warning("%s: %s", exc.code.name, exc.message)
        await context.abort(exc.code, exc.message, exc.trailing_metadata())
    log.exception("unexpected error in %s", type(exc).__name__)
    await context.abort(grpc.StatusCode.INTERNAL, "internal error in the service; see its log")


def rpc(method: F) -> F:
    """Turn ServiceError into its gRPC status and anything unexpected into INTERNAL (logged here,
    never sent to the client). Works for unary and server-streaming servicer methods."""
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as exc:
                await _abort(context, exc)

        return stream  # type: ignore[return-value]

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Awaitable[Any]:
        try:
            return await method(self, request, context)
        except Exception as exc:
            await _abort(context, exc)
            raise  # unreachable: abort raises

    return unary  # type: ignore[return-value]
