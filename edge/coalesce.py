"""Batch-while-busy towards the embed and rerank services: requests for one model leave together in one
batch RPC (EmbedBatch, RerankBatch) when they arrive in the same turn of the event loop, or, while this
process is busy, when `slots` calls for it are in flight (then as soon as a call returns). A request alone
goes as an ordinary unary call, from its own task: no timer, no added latency when idle. Under load, the
gRPC hop and the service's per-call work are paid per batch, not per request. A batch holds at most
MAX_INPUTS inputs: a large request goes alone.

"Busy" is this process's own CPU (tritongate/busy.py). An edge with CPU to spare is not what limits the
rate: holding requests for a slot would only leave the model's instances idle while they wait (a model
that takes tens of milliseconds a call), so what each turn of the loop brings leaves at once. A busy
edge pays for every call, so it keeps to `slots` and sends fewer, larger ones.

Each request keeps what a unary call would give it: its request id and its own deadline travel with it
(`ItemContext`), its failure is its own (an item error, mapped by the same table as a failed call), and
a caller that goes away (client disconnect) leaves the others' call alone; a call whose callers have all
gone is cancelled. The service admits each item on its own, so `max_in_flight` still counts requests.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc

from edge.errors import OpenAIError
from edge.telemetry import current
from tritongate.busy import ProcessBusy
from tritongate.common.v1 import common_pb2
from tritongate.logs import REQUEST_ID
from tritongate.wire import REQUEST_ID_KEY

MAX_ITEMS = 64  # requests per batch call at most
# Inputs (texts, documents) per batch call at most: small requests are what merging saves CPU on, while a
# large one is better sent alone, so that it runs beside the others (on other replicas) and not after them.
MAX_INPUTS = 64
_ALONE: Any = object()  # a waiting request's answer when it is to make its own unary call


@dataclass(slots=True)
class _Pending:
    request: Any
    request_id: str
    deadline: float  # time.monotonic()
    result: asyncio.Future[Any] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    submitted: float = 0.0  # stage timings: its arrival here (time.perf_counter)
    left: float = 0.0  # stage timings: when the batch call carrying it left (time.perf_counter)


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
    def __init__(self, calls: BatchCalls, timeout: float, slots: int, max_items: int = MAX_ITEMS,
                 max_inputs: int = MAX_INPUTS, busy: Callable[[], bool] | None = None) -> None:
        self.calls = calls
        self.timeout = timeout  # each request's deadline
        self.slots = slots  # calls in flight per model while busy
        self.busy = busy or ProcessBusy()
        self.max_items = max_items
        self.max_inputs = max_inputs
        self._waiting: dict[str, deque[_Pending]] = defaultdict(deque)
        self._in_flight: dict[str, int] = defaultdict(int)
        self._running: dict[asyncio.Task[None], list[_Pending]] = {}
        self._scheduled: set[str] = set()  # models whose dispatch is due in the loop's next turn

    async def call(self, request: Any) -> Any:
        """The service's answer to `request` (an OpenAIError when it fails)."""
        model = request.model
        pending = _Pending(request, REQUEST_ID.get(), time.monotonic() + self.timeout, submitted=time.perf_counter())
        self._waiting[model].append(pending)
        if model not in self._scheduled:  # after this turn of the loop, with whatever else arrived in it
            self._scheduled.add(model)
            asyncio.get_running_loop().call_soon(self._dispatch, model)
        try:
            outcome = await pending.result
        except asyncio.CancelledError:
            if pending.result.done() and not pending.result.cancelled() and pending.result.result() is _ALONE:
                self._release(model)  # its slot was taken for it
            raise
        finally:
            if not pending.result.done():
                pending.result.cancel()
            self._drop_abandoned()
        # Stage timings: the hold, until its batch call left, or now, when it makes its own call.
        current().hold = (pending.left if outcome is not _ALONE else time.perf_counter()) - pending.submitted
        if outcome is not _ALONE:
            return outcome
        try:  # alone: its own unary call, from the caller's task (no task of its own)
            return await self._unary(request, pending.request_id, pending.deadline - time.monotonic())
        finally:
            self._release(model)

    async def _unary(self, request: Any, request_id: str, timeout: float) -> Any:
        try:
            return await self.calls.unary(request, timeout=timeout, metadata=((REQUEST_ID_KEY, request_id),))
        except grpc.aio.AioRpcError as exc:
            raise self.calls.call_failure(exc) from None

    def _release(self, model: str) -> None:
        self._in_flight[model] -= 1
        self._dispatch(model)

    def _dispatch(self, model: str) -> None:
        self._scheduled.discard(model)
        waiting = self._waiting[model]
        slots = self.slots if self.busy() else math.inf
        while self._in_flight[model] < slots and waiting:
            batch: list[_Pending] = []
            inputs = 0
            while waiting and len(batch) < self.max_items:
                if waiting[0].result.done():
                    waiting.popleft()
                    continue
                size = self.calls.inputs(waiting[0].request)
                if batch and inputs + size > self.max_inputs:
                    break
                batch.append(waiting.popleft())
                inputs += size
            if not batch:
                break
            self._in_flight[model] += 1
            if len(batch) == 1:
                batch[0].result.set_result(_ALONE)
                continue
            task = asyncio.create_task(self._send(model, batch))
            self._running[task] = batch
            task.add_done_callback(lambda done: self._running.pop(done, None))

    def _drop_abandoned(self) -> None:
        """Cancel the calls whose callers have all gone."""
        for task, batch in list(self._running.items()):
            if all(pending.result.cancelled() for pending in batch):
                task.cancel()

    async def _send(self, model: str, batch: list[_Pending]) -> None:
        left = time.perf_counter()  # stage timings
        for pending in batch:
            pending.left = left
        try:
            outcomes = await self._batch(batch, time.monotonic())
        except grpc.aio.AioRpcError as exc:
            outcomes = [self.calls.call_failure(exc) for _ in batch]
        except OpenAIError as exc:
            outcomes = [exc] * len(batch)
        finally:
            self._release(model)
        for pending, outcome in zip(batch, outcomes, strict=True):
            if pending.result.done():
                continue
            if isinstance(outcome, BaseException):
                pending.result.set_exception(outcome)
            else:
                pending.result.set_result(outcome)

    async def _batch(self, batch: list[_Pending], now: float) -> list[Any]:
        calls = self.calls
        items = [calls.batch_item(request=p.request, context=common_pb2.ItemContext(
            request_id=p.request_id, timeout_s=max(p.deadline - now, 0.001))) for p in batch]
        timeout = max(p.deadline for p in batch) - now
        response = await calls.batch(calls.batch_request(items=items), timeout=timeout)
        if len(response.results) != len(batch):
            raise OpenAIError(500, "The service answered a batch call out of order; see its log.")
        return [calls.item_failure(result.error) if result.WhichOneof("outcome") == "error" else result.response
                for result in response.results]
