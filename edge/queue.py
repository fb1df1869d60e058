"""Priority and fair queuing at the edge, per model, in front of the services' own admission.

Why here: the edge is where a request's key and priority are known, and where a waiting request costs
nothing but a future (a request refused by a service and retried would spend a round trip each time and
still not be served in order). Each edge process lets at most `TRITONGATE_QUEUE_SLOTS` requests of one
model reach its service at once; the others wait, ordered by priority class (lower first; an in-process
batch request's class, `BATCH`, after every class a client may ask for), then round robin between keys
within a class, so that one key's volume does not crowd out another's. A request waits at most
`TRITONGATE_QUEUE_TIMEOUT_S`, then 429 with Retry-After; a full queue (`TRITONGATE_QUEUE_MAX_WAITING`) is
a 429 at once. With no slots configured (0) requests go straight on, as without a queue.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import Generic, TypeVar

from prometheus_client import Gauge, Histogram

from edge.errors import OpenAIError

T = TypeVar("T")
BATCH = 1_000  # below any client priority (-100..100)

QUEUE_DEPTH = Gauge("tritongate_queue_depth", "Requests waiting at the edge for a model, by priority class.",
                    ("model", "priority"), multiprocess_mode="livesum")
QUEUE_WAIT = Histogram("tritongate_queue_wait_seconds", "Time requests waited at the edge for a model.",
                       ("model",), buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))


def class_label(priority: int) -> str:
    return "batch" if priority >= BATCH else str(priority)


class FairQueue(Generic[T]):
    """Waiting items by priority class (lowest first), and within a class round robin between keys: after a
    key is served it goes to the back of its class's rotation."""

    def __init__(self) -> None:
        self._classes: dict[int, OrderedDict[str, deque[T]]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, priority: int, key: str, item: T) -> None:
        self._classes.setdefault(priority, OrderedDict()).setdefault(key, deque()).append(item)
        self._size += 1

    def pop(self) -> tuple[int, T] | None:
        """The next item to serve and its class; None when empty."""
        if not self._classes:
            return None
        priority = min(self._classes)
        keys = self._classes[priority]
        key, items = next(iter(keys.items()))
        item = items.popleft()
        if items:
            keys.move_to_end(key)
        else:
            del keys[key]
        if not keys:
            del self._classes[priority]
        self._size -= 1
        return priority, item

    def remove(self, priority: int, key: str, item: T) -> bool:
        keys = self._classes.get(priority)
        items = keys.get(key) if keys is not None else None
        if items is None or item not in items:
            return False
        items.remove(item)
        if not items:
            del keys[key]  # type: ignore[union-attr]
            if not keys:
                del self._classes[priority]
        self._size -= 1
        return True

    def __iter__(self) -> Iterator[T]:
        for keys in self._classes.values():
            for items in keys.values():
                yield from items


class ModelGate:
    """One model's slots in this edge process and the requests waiting for one."""

    def __init__(self, model: str, slots: int, max_waiting: int, timeout_s: float, retry_after_s: int) -> None:
        self.model = model
        self.slots = slots
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self.busy = 0
        self.waiting: FairQueue[asyncio.Future[None]] = FairQueue()

    def _busy_error(self, message: str, code: str) -> OpenAIError:
        return OpenAIError(429, message, code=code, type_="rate_limit_error",
                           headers={"Retry-After": str(max(1, self.retry_after_s))})

    async def acquire(self, priority: int, key: str) -> None:
        """A slot for one request: at once when one is free and nobody waits, else in turn (429 after the
        longest wait, or at once when the queue is full)."""
        if self.busy < self.slots and not len(self.waiting):
            self.busy += 1
            return
        if len(self.waiting) >= self.max_waiting:
            raise self._busy_error(f"The model `{self.model}` is at capacity and its queue is full; try again "
                                   "shortly.", "queue_full")
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiting.push(priority, key, turn)
        depth = QUEUE_DEPTH.labels(self.model, class_label(priority))
        depth.inc()
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_s):
                await asyncio.shield(turn)
        except BaseException as exc:
            if turn.done() and not turn.cancelled():
                self.release()  # granted as it gave up: pass the slot on
            elif self.waiting.remove(priority, key, turn):
                depth.dec()
            turn.cancel()
            if isinstance(exc, TimeoutError):
                raise self._busy_error(f"The model `{self.model}` stayed at capacity for {self.timeout_s:g} s; "
                                       "try again shortly.", "queue_timeout") from None
            raise
        finally:
            QUEUE_WAIT.labels(self.model).observe(time.perf_counter() - start)

    def release(self) -> None:
        """A slot given back: to the next waiting request, if any."""
        while (entry := self.waiting.pop()) is not None:
            priority, turn = entry
            QUEUE_DEPTH.labels(self.model, class_label(priority)).dec()
            if not turn.done():
                turn.set_result(None)  # the slot passes on: `busy` stays
                return
        self.busy -= 1


class ModelGates:
    """Every model's gate in this edge process (none when no slots are configured)."""

    def __init__(self, slots: int, max_waiting: int, timeout_s: float, retry_after_s: int) -> None:
        self.slots = slots
        self.max_waiting = max_waiting
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_s
        self._gates: dict[str, ModelGate] = {}

    def gate(self, model: str) -> ModelGate | None:
        if self.slots <= 0:
            return None
        gate = self._gates.get(model)
        if gate is None:
            gate = self._gates[model] = ModelGate(model, self.slots, self.max_waiting, self.timeout_s,
                                                  self.retry_after_s)
        return gate
