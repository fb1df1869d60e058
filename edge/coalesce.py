"""Batch-while-busy towards the embed and rerank services (tritongate/batching.py): requests for one model
leave together in one batch RPC (EmbedBatch, RerankBatch) when they arrive in the same turn of the event
loop, or, while this process is busy, when `slots` calls for it are in flight (then as soon as a call
returns). A request alone goes as an ordinary unary call, from its own task: no timer, no added latency
when idle. Under load, the gRPC hop and the service's per-call work are paid per batch, not per request.
A batch holds at most `max_inputs` inputs: a large request goes alone.

Each request keeps what a unary call would give it: its request id, its own deadline and, with tracing
on, its span travel with it (`ItemContext`), its failure is its own (an item error, mapped by the same
table as a failed call, in the caller's task, so that what it logs carries the caller's request id), and
a caller that goes away (client disconnect) leaves the others' call alone; a call whose callers have all
gone is cancelled. The service serves each item as the unary call it stands for (services/common/items.py),
so `max_in_flight` and its metrics still count requests.
How long a request waited here before its call left: `Item.held_s` of the item from `Coalescer.item`.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc

from edge.errors import OpenAIError
from edge.telemetry import current
from tritongate import tracing
from tritongate.batching import EDGE_MAX_INPUTS, EDGE_MAX_ITEMS, Batches, Item, ProcessBusy
from tritongate.common.v1 import common_pb2
from tritongate.wire import REQUEST_ID_KEY

Request = Item[Any, Any]  # a service request (EmbedRequest, RerankRequest) and its answer


@dataclass
class BatchCalls:
    """How one service's calls are made: the unary method, the batch method and its message types, and
    how a failure becomes an OpenAI error."""

    unary: Callable[..., Awaitable[Any]]  # stub.Embed
    batch: Callable[..., Awaitable[Any]]  # stub.EmbedBatch
    batch_request: Callable[..., Any]  # EmbedBatchRequest
    batch_item: Callable[..., Any]  # EmbedBatchItem
    inputs: Callable[[Any], int]  # a request's inputs (texts, documents)
    call_failure: Callable[[grpc.aio.AioRpcError], OpenAIError]
    item_failure: Callable[[common_pb2.ItemError], OpenAIError]


class Coalescer:
    def __init__(self, calls: BatchCalls, timeout: float, slots: int, max_items: int = EDGE_MAX_ITEMS,
                 max_inputs: int = EDGE_MAX_INPUTS, busy: Callable[[], bool] | None = None) -> None:
        self.calls = calls
        self.timeout = timeout  # each request's deadline
        self.slots = slots  # calls in flight per model while busy
        self.busy = busy or ProcessBusy()  # one measure for all models
        self.max_items = max_items
        self.max_inputs = max_inputs
        self._models: dict[str, Batches[Any, Any]] = {}

    def item(self, request: Any) -> Request:
        """`request` as an item to `send` (its `held_s` is how long it waits here)."""
        spans = tracing.ITEM_SPANS  # None while tracing is off
        return Item(request, self.calls.inputs(request), trace=spans.traceparent() if spans is not None else "")

    async def call(self, request: Any) -> Any:
        """The service's answer to `request` (an OpenAIError when it fails). How long it waited here is the
        request's `hold` stage (edge/telemetry.py)."""
        item = self.item(request)
        try:
            return await self.send(item)
        finally:
            current().hold = item.held_s

    async def send(self, item: Request) -> Any:
        """The service's answer to `item`'s request (an OpenAIError when it fails)."""
        model = item.payload.model
        batches = self._models.get(model)
        if batches is None:
            batches = self._models[model] = Batches(self._batch, self.slots, self.max_inputs, self.max_items,
                                                    alone=self._unary, busy=self.busy)
        try:  # failures mapped here, in the caller's task: their log lines carry its own request id
            (answer,) = await batches.run((item,))
        except grpc.aio.AioRpcError as exc:
            raise self.calls.call_failure(exc) from None
        except _ItemFailed as failed:
            raise self.calls.item_failure(failed.error) from None
        return answer

    def _deadline(self, item: Request) -> float:
        return item.submitted + self.timeout

    async def _unary(self, item: Request) -> Any:
        return await self.calls.unary(item.payload, timeout=self._deadline(item) - time.monotonic(),
                                      metadata=((REQUEST_ID_KEY, item.request_id),))

    async def _batch(self, batch: list[Request]) -> list[Any]:
        calls, now = self.calls, time.monotonic()
        items = [calls.batch_item(request=item.payload, context=common_pb2.ItemContext(
            request_id=item.request_id, timeout_s=max(self._deadline(item) - now, 0.001), traceparent=item.trace))
                 for item in batch]
        response = await calls.batch(calls.batch_request(items=items),
                                     timeout=max(self._deadline(item) for item in batch) - now)
        if len(response.results) != len(batch):
            raise OpenAIError(500, "The service answered a batch call out of order; see its log.")
        return [_ItemFailed(result.error) if result.WhichOneof("outcome") == "error" else result.response
                for result in response.results]


class _ItemFailed(Exception):
    """An item's error in a batch call's answer, on its way to its caller."""

    def __init__(self, error: common_pb2.ItemError) -> None:
        super().__init__(error.message)
        self.error = error
