"""The encoder Batcher: merging concurrent requests into Triton calls (a fake call, no Triton). Unless a test
says otherwise, the batcher counts its process as busy, so that it keeps to its slots whatever this test
process's own CPU does."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from services.common.encoder import Batcher, Row, instance_count


class RecordingCall:
    """The batcher's model call: records each call's rows; calls block until released, to build up a queue."""

    def __init__(self, fail_on: int | None = None) -> None:
        self.calls: list[list[int]] = []
        self.release = asyncio.Event()
        self.fail_on = fail_on

    async def __call__(self, rows: list[Row]) -> np.ndarray:
        ids = [row.input_ids[0] for row in rows]
        self.calls.append(ids)
        await self.release.wait()
        if self.fail_on in ids:
            raise RuntimeError("boom")
        return np.array([[i * 10] for i in ids])


def batcher_of(call: Any, batch_size: int, slots: int, instances: int = 1, busy: bool = True) -> Batcher:
    return Batcher(call, batch_size=batch_size, slots=slots, instances=instances, busy=lambda: busy)


def rows(*ids: int) -> list[Row]:
    return [Row([i]) for i in ids]


async def settle() -> None:
    """Let the submitted tasks run and the batcher dispatch (a turn of the loop after a submission)."""
    for _ in range(3):
        await asyncio.sleep(0)


async def test_an_idle_batcher_sends_at_once() -> None:
    fake = RecordingCall()
    fake.release.set()
    batcher = batcher_of(fake, batch_size=8, slots=2)
    result = await batcher.submit(rows(1, 2))
    assert fake.calls == [[1, 2]]
    assert result.tolist() == [[10], [20]]


async def test_requests_waiting_for_a_slot_leave_together() -> None:
    fake = RecordingCall()
    batcher = batcher_of(fake, batch_size=8, slots=1)
    first = asyncio.create_task(batcher.submit(rows(1)))
    await settle()
    others = [asyncio.create_task(batcher.submit(rows(i, i + 1))) for i in (2, 4, 6)]
    await settle()
    assert fake.calls == [[1]]  # the rest wait for the one slot
    fake.release.set()
    results = await asyncio.gather(first, *others)
    assert fake.calls == [[1], [2, 3, 4, 5, 6, 7]]
    assert [r.ravel().tolist() for r in results] == [[10], [20, 30], [40, 50], [60, 70]]


async def test_with_cpu_to_spare_what_arrives_leaves_at_once_whatever_the_slots() -> None:
    fake = RecordingCall()
    batcher = batcher_of(fake, batch_size=8, slots=1, instances=2, busy=False)
    first = asyncio.create_task(batcher.submit(rows(1)))
    await settle()
    later = [asyncio.create_task(batcher.submit(rows(i))) for i in (2, 3)]
    await settle()
    last = asyncio.create_task(batcher.submit(rows(4)))
    await settle()
    # Each turn's rows on their way, spread over the instances that are idle; none held for the slot.
    assert fake.calls == [[1], [2, 3], [4]]
    fake.release.set()
    results = await asyncio.gather(first, *later, last)
    assert [r.ravel().tolist() for r in results] == [[10], [20], [30], [40]]


async def test_requests_submitted_in_the_same_turn_leave_together_even_with_slots_free() -> None:
    fake = RecordingCall()
    fake.release.set()
    batcher = batcher_of(fake, batch_size=8, slots=4)
    results = await asyncio.gather(*(batcher.submit(rows(i)) for i in (1, 2, 3)))
    assert fake.calls == [[1, 2, 3]]
    assert [r.ravel().tolist() for r in results] == [[10], [20], [30]]


async def test_what_leaves_together_is_spread_over_the_idle_model_instances() -> None:
    fake = RecordingCall()
    batcher = batcher_of(fake, batch_size=8, slots=4, instances=2)
    first = [asyncio.create_task(batcher.submit(rows(i))) for i in (1, 2, 3)]
    big = asyncio.create_task(batcher.submit(rows(4, 5, 6, 7, 8)))  # a batch RPC's requests, as one
    await settle()
    assert sorted(fake.calls) == [[1, 2, 3], [4, 5, 6, 7, 8]]  # both instances busy (a request's parts stay whole)
    later = [asyncio.create_task(batcher.submit(rows(i))) for i in (9, 10, 11)]
    await settle()
    assert fake.calls[2:] == [[9, 10, 11]]  # no instance idle: what arrives leaves in one call
    fake.release.set()
    results = await asyncio.gather(*first, big, *later)
    assert [r.ravel().tolist() for r in results][3] == [40, 50, 60, 70, 80]


def test_the_instances_of_a_triton_model_are_read_from_its_instance_groups() -> None:
    assert instance_count({}) == 1
    assert instance_count({"instance_group": [{"kind": "KIND_CPU", "count": 2}]}) == 2
    assert instance_count({"instance_group": [{"count": 2, "gpus": [0, 1]}, {"kind": "KIND_CPU"}]}) == 5


async def test_large_requests_are_split_into_equal_parts_of_at_most_the_batch_size() -> None:
    fake = RecordingCall()
    fake.release.set()
    batcher = batcher_of(fake, batch_size=4, slots=4)
    await batcher.submit(rows(*range(1, 6)))
    assert sorted(fake.calls) == [[1, 2, 3], [4, 5]]


async def test_large_requests_are_split_at_the_batch_size() -> None:
    fake = RecordingCall()
    fake.release.set()
    batcher = batcher_of(fake, batch_size=3, slots=4)
    result = await batcher.submit(rows(*range(1, 9)))
    assert sorted(fake.calls) == [[1, 2, 3], [4, 5, 6], [7, 8]]
    assert result.ravel().tolist() == [i * 10 for i in range(1, 9)]


async def test_a_cancelled_caller_does_not_reach_triton() -> None:
    fake = RecordingCall()
    batcher = batcher_of(fake, batch_size=8, slots=1)
    first = asyncio.create_task(batcher.submit(rows(1)))
    await settle()
    gone = asyncio.create_task(batcher.submit(rows(2)))
    kept = asyncio.create_task(batcher.submit(rows(3)))
    await settle()
    gone.cancel()
    fake.release.set()
    await first
    assert (await kept).ravel().tolist() == [30]
    assert fake.calls == [[1], [3]]
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_failed_call_fails_only_its_own_requests() -> None:
    fake = RecordingCall(fail_on=2)
    batcher = batcher_of(fake, batch_size=1, slots=2)
    fake.release.set()
    results = await asyncio.gather(batcher.submit(rows(1)), batcher.submit(rows(2)), return_exceptions=True)
    assert isinstance(results[1], RuntimeError)
    assert results[0].ravel().tolist() == [10]  # type: ignore[union-attr]
    assert (await batcher.submit(rows(3))).ravel().tolist() == [30]  # and it keeps serving


async def test_a_triton_call_whose_callers_all_left_is_cancelled() -> None:
    cancelled: list[list[int]] = []

    async def call(batch: list[Row]) -> np.ndarray:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append([row.input_ids[0] for row in batch])
            raise
        return np.zeros((len(batch), 1))

    batcher = batcher_of(call, batch_size=8, slots=1)
    alone = asyncio.create_task(batcher.submit(rows(1)))
    await settle()
    shared = [asyncio.create_task(batcher.submit(rows(i))) for i in (2, 3)]  # wait, then leave together
    await settle()
    alone.cancel()  # its deadline passed: its call is dropped, the waiting two leave together
    await asyncio.sleep(0.01)
    assert cancelled == [[1]]
    shared[0].cancel()  # one of two callers gone: the call goes on for the other
    await asyncio.sleep(0.01)
    assert cancelled == [[1]]
    shared[1].cancel()
    await asyncio.sleep(0.01)
    assert cancelled == [[1], [2, 3]]
    await asyncio.gather(alone, *shared, return_exceptions=True)


async def test_no_rows_make_no_call() -> None:
    fake = RecordingCall()
    result = await batcher_of(fake, batch_size=8, slots=1).submit([])
    assert fake.calls == [] and result.shape == (0, 0)
