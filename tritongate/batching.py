"""Batch-while-busy: the one batching algorithm of the edge (edge/coalesce.py: requests → EmbedBatch and
RerankBatch calls to a service) and of the embed and rerank services (services/common/encoder.py: rows →
Triton calls).

Items submitted in one turn of the event loop leave together after that turn (no timer: no added latency
when idle). While this process is busy (`ProcessBusy` below), at most `slots` calls are in flight: what
arrives while none is free waits, and leaves together when a call returns, so that a busy process pays
the per-call CPU (an RPC, a tokenizer call, a Triton request) once for many items. A process with CPU to
spare holds nothing back: the model's own batcher merges calls as soon as it is free, where items held
here would reach it late, in smaller batches.

A call carries at most `max_items` items and at most `max_size` of their size (inputs at the edge, rows
in a service), or one item if that alone is larger; what leaves at once is spread in equal parts over
the `instances` that are idle (Triton runs one call on one model instance), so that they finish
together. Each item's answer or exception is its own; a caller that goes away leaves the others' call
alone, and a call whose callers have all gone is cancelled. A call runs in a task of its own, in a
context of its own: its log lines carry the ids of the requests it serves, joined by "," (`joined_id`),
never one of them alone. Each item records when it was submitted and when its call left (`Item.held_s`).

The knobs, and why the two layers' defaults differ (docs/configuration.md lists where each is set):

- `slots` while busy: EDGE_SLOTS (2, `TRITONGATE_CALLS_PER_MODEL`) calls per model from an edge process,
  SERVICE_SLOTS (4, each model's `max_concurrent_batches`) Triton calls per model from a service process.
  An edge call goes to a service that batches and spreads again, so each edge call more only costs CPU
  on both sides (1 gave the least CPU per request, 4 clearly more; 2 keeps the service busy while a
  batch is on the wire: docs/benchmarks.md). A service call occupies one model instance, so its slots
  must cover the instances it keeps busy.
- `max_items`, `max_size`: EDGE_MAX_ITEMS and EDGE_MAX_INPUTS (64 requests, 64 inputs) per batch RPC,
  where merging small requests is what saves CPU and a large request is better sent alone, to run
  beside the others on other replicas; in a service, no item limit and the model's batch size in rows
  (a Triton limit, from the model's `max_batch_size`).
- `instances`: 1 at the edge (a service spreads its calls itself); in a service, the Triton model's
  instances on all its ready endpoints.
- An edge item alone in its call goes as an ordinary unary call from its caller's task (`alone`); a
  service splits a large request into equal parts of at most its batch size, at least one per instance
  (services/common/encoder.py).
- Busy: 0.3 of a core over the last half second (`ProcessBusy` below), the same in both layers.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from tritongate.logs import NO_REQUEST, REQUEST_ID

EDGE_SLOTS = 2
EDGE_MAX_ITEMS = 64
EDGE_MAX_INPUTS = 64
SERVICE_SLOTS = 4
MAX_BATCH_IDS = 256  # characters of the joined request ids a call carries

P = TypeVar("P")  # what an item carries (a request, rows)
R = TypeVar("R")  # its answer
_ALONE: Any = object()  # an item's result when its caller is to make its call itself (`alone`)


def joined_id(request_ids: Iterable[str]) -> str:
    """The id of a call that serves several requests: their distinct ids, joined by "," (capped)."""
    distinct = dict.fromkeys(rid for rid in request_ids if rid and rid != NO_REQUEST)
    return ",".join(distinct)[:MAX_BATCH_IDS] or NO_REQUEST


def new_loop_future() -> asyncio.Future[Any]:
    return asyncio.get_running_loop().create_future()


@dataclass(slots=True, eq=False)
class Item(Generic[P, R]):
    """One item to batch: its payload, its size (inputs, rows), the id of the request it belongs to (the
    submitter's by default) and, with tracing on, that request's span (`trace`, a W3C traceparent, for the
    edge's batch RPCs), and when it was submitted and when its call left (time.monotonic())."""

    payload: P
    size: int = 1
    request_id: str = field(default_factory=REQUEST_ID.get)
    trace: str = ""
    submitted: float = field(default_factory=lambda: time.monotonic())  # the clock of the moment (tests')
    sent: float | None = None  # set when its call leaves (or, alone, when it may go)
    result: asyncio.Future[R] = field(default_factory=new_loop_future)

    @property
    def held_s(self) -> float:
        """Seconds it waited to be sent (so far, while it still waits)."""
        return (time.monotonic() if self.sent is None else self.sent) - self.submitted


Call = Callable[[list[Item[P, R]]], Awaitable[Sequence[R | BaseException]]]
"""One call for the items of a batch: an answer or an exception for each, in order (an exception it
raises is every item's)."""


class Batches(Generic[P, R]):
    """Batch-while-busy for one model (see the module's docstring)."""

    def __init__(self, call: Call[P, R], slots: int, max_size: int, max_items: float = math.inf,
                 instances: int = 1, alone: Callable[[Item[P, R]], Awaitable[R]] | None = None,
                 busy: Callable[[], bool] | None = None) -> None:
        self.call = call
        self.slots = slots  # calls in flight while busy
        self.max_size = max_size
        self.max_items = max_items
        self.instances = instances
        self.alone = alone  # the call for an item alone in its batch, made from its caller's task
        self.busy = busy or ProcessBusy()
        self._waiting: deque[Item[P, R]] = deque()
        self._in_flight = 0
        self._running: dict[asyncio.Task[None], list[Item[P, R]]] = {}  # calls and whose items they carry
        self._scheduled = False

    async def run(self, items: Sequence[Item[P, R]]) -> list[R]:
        """The answers to `items`, in order (an item's exception is raised as its caller's)."""
        self._waiting.extend(items)
        if not self._scheduled:  # after this turn of the loop, with whatever else arrives in it
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._dispatch)
        try:
            if len(items) == 1:
                return [await self._outcome(items[0])]
            return list(await asyncio.gather(*(item.result if self.alone is None else self._outcome(item)
                                               for item in items)))
        finally:
            for item in items:  # a gone caller's items are skipped if they have not left yet
                item.result.cancel()
            self._drop_abandoned()

    async def _outcome(self, item: Item[P, R]) -> R:
        try:
            outcome = await item.result
        except asyncio.CancelledError:
            if item.result.done() and not item.result.cancelled() and item.result.result() is _ALONE:
                self._release()  # its slot was taken for it
            raise
        if outcome is not _ALONE or self.alone is None:
            return outcome
        try:  # alone: its own call, from its caller's task (no task of its own)
            return await self.alone(item)
        finally:
            self._release()

    def _release(self) -> None:
        self._in_flight -= 1
        self._dispatch()

    def _dispatch(self) -> None:
        self._scheduled = False
        waiting = self._waiting
        slots = self.slots if self.busy() else math.inf
        while self._in_flight < slots and waiting:
            limit = self.max_size
            calls = min(slots, self.instances) - self._in_flight  # idle instances: one call each
            if calls > 1:
                limit = min(limit, math.ceil(sum(i.size for i in waiting if not i.result.done()) / calls))
            batch: list[Item[P, R]] = []
            size = 0
            while waiting and len(batch) < self.max_items:
                if waiting[0].result.done():  # its caller has gone
                    waiting.popleft()
                    continue
                if batch and size + waiting[0].size > limit:
                    break
                batch.append(waiting.popleft())
                size += batch[-1].size
            if not batch:
                break
            self._in_flight += 1
            now = time.monotonic()
            for item in batch:
                item.sent = now
            if len(batch) == 1 and self.alone is not None:
                batch[0].result.set_result(_ALONE)
                continue
            # Its own context: nothing of the request whose arrival scheduled this dispatch.
            task = asyncio.create_task(self._send(batch), context=contextvars.Context())
            self._running[task] = batch
            task.add_done_callback(self._running.pop)

    def _drop_abandoned(self) -> None:
        """Cancel the calls whose callers have all gone."""
        for task, batch in list(self._running.items()):
            if all(item.result.cancelled() for item in batch):
                task.cancel()

    async def _send(self, batch: list[Item[P, R]]) -> None:
        REQUEST_ID.set(joined_id(item.request_id for item in batch))  # for its log lines and its call
        try:
            outcomes: Sequence[R | BaseException] = await self.call(batch)
            if len(outcomes) != len(batch):
                raise RuntimeError(f"{len(outcomes)} answers to a call of {len(batch)} items")
        except Exception as exc:
            outcomes = [exc] * len(batch)
        finally:
            self._release()
        for item, outcome in zip(batch, outcomes, strict=True):
            if item.result.done():
                continue
            if isinstance(outcome, BaseException):
                item.result.set_exception(outcome)
            else:
                item.result.set_result(outcome)


# Whether this process is busy: what decides whether a layer holds requests back for a call slot. Holding
# requests until a call returns makes fewer, larger calls: it saves the CPU each call costs, which is what
# limits the rate when the process is busy (a fast model, e.g. on a GPU). A process with CPU to spare is not
# what limits the rate, and holding there would only keep requests from a slow model (tens of milliseconds a
# call, e.g. on a CPU) whose own batcher would merge them as soon as an instance is free: Triton's batches
# come out smaller, and the model pays per row.
# From this share of one core (all the process's threads, over the last WINDOW_S) a process counts as
# busy. A gateway process in front of a slow model uses about a tenth of a core; one that limits the
# rate, most of one.
BUSY_CORES = 0.3
WINDOW_S = 0.5


class ProcessBusy:
    """Whether this process used at least `cores` of CPU time per second of wall time over its last
    window (read again once the window has passed, so that asking costs a clock read)."""

    def __init__(self, cores: float = BUSY_CORES, window: float = WINDOW_S,
                 cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores
        self.window = window
        self._cpu = cpu
        self._clock = clock
        self._since = clock()
        self._cpu_since = cpu()
        self._busy = False

    def __call__(self) -> bool:
        now = self._clock()
        if now - self._since >= self.window:
            spent = self._cpu()
            self._busy = (spent - self._cpu_since) / (now - self._since) >= self.cores
            self._since, self._cpu_since = now, spent
        return self._busy
