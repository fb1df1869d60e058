"""The edge's model queue (edge/queue.py): the order of the waiting requests (priority class, then round robin
between keys), the slot handed on, the wait bound and the queue bound."""

from __future__ import annotations

import asyncio

import pytest

from edge.errors import OpenAIError
from edge.queue import BATCH, FairQueue, ModelGate


def drain(queue: FairQueue[str]) -> list[str]:
    order = []
    while (entry := queue.pop()) is not None:
        order.append(entry[1])
    return order


def test_lower_priority_classes_go_first_and_batch_last() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push(BATCH, "bulk", "batch-1")
    queue.push(10, "a", "low-1")
    queue.push(10, "a", "low-2")
    queue.push(-5, "b", "high-1")
    queue.push(0, "c", "normal-1")
    assert len(queue) == 5
    assert drain(queue) == ["high-1", "normal-1", "low-1", "low-2", "batch-1"]
    assert len(queue) == 0


def test_keys_of_one_class_take_turns_whatever_their_volume() -> None:
    queue: FairQueue[str] = FairQueue()
    for i in range(6):
        queue.push(0, "bulk", f"bulk-{i}")
    for i in range(2):
        queue.push(0, "small", f"small-{i}")
    queue.push(0, "third", "third-0")
    assert drain(queue) == ["bulk-0", "small-0", "third-0", "bulk-1", "small-1", "bulk-2", "bulk-3", "bulk-4",
                            "bulk-5"]


def test_a_removed_item_is_never_served() -> None:
    queue: FairQueue[str] = FairQueue()
    queue.push(0, "a", "a-0")
    queue.push(0, "a", "a-1")
    queue.push(1, "b", "b-0")
    assert queue.remove(0, "a", "a-0") and queue.remove(1, "b", "b-0")
    assert not queue.remove(1, "b", "b-0")
    assert drain(queue) == ["a-1"]


async def _served_in_order(gate: ModelGate, requests: list[tuple[int, str, str]]) -> list[str]:
    """Hold the gate's one slot, queue `requests` (priority, key, label), then release: the order served."""
    await gate.acquire(0, "holder")
    served: list[str] = []

    async def one(priority: int, key: str, label: str) -> None:
        await gate.acquire(priority, key)
        served.append(label)
        await asyncio.sleep(0)
        gate.release()

    tasks = []
    for request in requests:
        tasks.append(asyncio.create_task(one(*request)))
        await asyncio.sleep(0)  # queued in this order
    assert len(gate.waiting) == len(requests)
    gate.release()
    await asyncio.gather(*tasks)
    return served


def test_a_full_gate_serves_the_higher_priority_next_and_hands_on_each_slot() -> None:
    gate = ModelGate("m", slots=1, max_waiting=100, timeout_s=30, retry_after_s=1)
    requests = [(10, "bulk", f"bulk-{i}") for i in range(4)] + [(-1, "user", "user-0"), (BATCH, "batch", "batch-0")]
    served = asyncio.run(_served_in_order(gate, requests))
    assert served == ["user-0", "bulk-0", "bulk-1", "bulk-2", "bulk-3", "batch-0"]
    assert gate.busy == 0 and len(gate.waiting) == 0


def test_a_request_that_waits_too_long_is_a_429_and_leaves_the_queue() -> None:
    async def run() -> OpenAIError:
        gate = ModelGate("m", slots=1, max_waiting=100, timeout_s=0.01, retry_after_s=2)
        await gate.acquire(0, "holder")
        with pytest.raises(OpenAIError) as raised:
            await gate.acquire(0, "late")
        assert len(gate.waiting) == 0
        gate.release()
        assert gate.busy == 0
        return raised.value

    error = asyncio.run(run())
    assert error.status == 429 and error.code == "queue_timeout" and error.headers == {"Retry-After": "2"}


def test_a_full_queue_is_a_429_at_once_and_a_cancelled_waiter_gives_its_place_up() -> None:
    async def run() -> None:
        gate = ModelGate("m", slots=1, max_waiting=1, timeout_s=30, retry_after_s=1)
        await gate.acquire(0, "holder")
        waiter = asyncio.create_task(gate.acquire(0, "a"))
        await asyncio.sleep(0)
        with pytest.raises(OpenAIError) as raised:
            await gate.acquire(0, "b")
        assert raised.value.code == "queue_full"
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert len(gate.waiting) == 0
        gate.release()
        assert gate.busy == 0

    asyncio.run(run())
