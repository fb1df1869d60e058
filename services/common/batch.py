"""The batch RPCs (EmbedBatch, RerankBatch): several requests in one call, each served as its own unary
call would be. The edge sends them when requests for one model arrive while another call is in flight.

Each item runs in its own task, with its own request id bound (log lines, Triton request ids), its own
deadline, and its own admission slot, so that `max_in_flight` counts requests however they travel; an
item that fails (a bad input, no slot, the deadline) fails alone, with the status a unary call would
have had.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

import grpc

from services.common.admission import Admission
from services.common.encoder import EncoderModel
from services.common.errors import ServiceError
from services.common.metrics import BATCHED
from services.common.server import ModelSet
from tritongate.common.v1 import common_pb2
from tritongate.logs import NO_REQUEST, bind_request_id
from tritongate.wire import OVERLOADED

log = logging.getLogger(__name__)

_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}  # a status code's number → its name

Response = TypeVar("Response")
M = TypeVar("M", bound=EncoderModel)


class Item(Protocol):
    """An item of a batch request (EmbedBatchItem, RerankBatchItem)."""

    @property
    def request(self) -> Any: ...

    @property
    def context(self) -> common_pb2.ItemContext: ...


def item_error(exc: BaseException) -> common_pb2.ItemError:
    """What a unary call would have ended with; anything unexpected is logged and is INTERNAL."""
    if isinstance(exc, ServiceError):
        return common_pb2.ItemError(code=exc.code.value[0], message=exc.message, param=exc.param or "",
                                    error_code=exc.error_code or "")
    log.error("unexpected error in %s", type(exc).__name__, exc_info=exc)
    return common_pb2.ItemError(code=grpc.StatusCode.INTERNAL.value[0],
                                message="internal error in the service; see its log")


def encode_by_model(models: ModelSet[M], requests: Sequence[Any]) -> list[Any]:
    """Each request's tokens, from one `encode_many` per model over all its requests (None where the
    model is unknown: that request fails on its own later)."""
    encoded: list[Any] = [None] * len(requests)
    for name in {r.model for r in requests} & set(models.names()):
        positions = [i for i, r in enumerate(requests) if r.model == name]
        for i, tokens in zip(positions, models.get(name).encode_many([requests[i] for i in positions]), strict=True):
            encoded[i] = tokens
    return encoded


async def serve_batch(models: ModelSet[M], request: Any, admission: Admission | None,
                      serve: Callable[[M, Any, float | None, Any], Awaitable[Any]], method: str,
                      result: Callable[..., Any], response: Callable[..., Response]) -> Response:
    """The answer to a batch RPC (`request.items`): `serve(model, request, timeout, tokens)` for every item
    concurrently, the tokenization done for all items of each model first; each item's answer or error as
    a `result(response=...)` or `result(error=...)` in `response(results=[...])`."""
    items: Sequence[Item] = request.items
    encoded = encode_by_model(models, [item.request for item in items])

    async def one(position: int, item: Item) -> Any:
        bind_request_id(item.context.request_id or NO_REQUEST)  # this item's task alone
        if admission is not None and not admission.try_enter():
            return common_pb2.ItemError(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                                        message=admission.message(), error_code=OVERLOADED)
        try:
            model = models.get(item.request.model)
            return await serve(model, item.request, item.context.timeout_s or None, encoded[position])
        except Exception as exc:
            if isinstance(exc, ServiceError) and exc.code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE):
                log.warning("%s: %s", exc.code.name, exc.message)
            return item_error(exc)
        finally:
            if admission is not None:
                admission.leave()

    outcomes = await asyncio.gather(*(one(i, item) for i, item in enumerate(items)))
    results = []
    for outcome in outcomes:
        failed = isinstance(outcome, common_pb2.ItemError)
        BATCHED.labels(method, _CODE_NAMES.get(outcome.code, "UNKNOWN") if failed else "OK").inc()
        results.append(result(error=outcome) if failed else result(response=outcome))
    return response(results=results)
