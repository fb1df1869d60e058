"""The batching primitive (tritongate/batching.py) with fake calls, no Triton and no service: what leaves
together, how calls are cut and spread, what a busy process holds back, each item's own answer, the
calls whose callers went away, the context a call runs in, and how long each item was held. Unless a
test says otherwise, the process counts as busy, whatever this test process's own CPU does."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import grpc
import pytest

from services.common.batch import serve_batch
from services.common.errors import ServiceError
from services.common.items import ItemCalls
from services.embed.servicer import EMBED_CALL
from tritongate.batching import MAX_BATCH_IDS, Batches, Item, joined_id
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2
from tritongate.logs import NO_REQUEST, REQUEST_ID, RequestIdFilter

log = logging.getLogger("test.batching")


class FakeCall:
    """Answers each item with its payload doubled (or fails the items whose payload is in `fail`);
    records each call's payloads and the request id it ran under; waits for `release`."""

    def __init__(self, fail: Sequence[int] = ()) -> None:
        self.calls: list[list[int]] = []
        self.ids: list[str] = []
        self.release = asyncio.Event()
        self.cancelled: list[list[int]] = []
        self.fail = fail

    async def __call__(self, items: list[Item[int, int]]) -> list[int | BaseException]:
        payloads = [item.payload for item in items]
        self.calls.append(payloads)
        self.ids.append(REQUEST_ID.get())
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(payloads)
            raise
        return [ValueError(p) if p in self.fail else p * 2 for p in payloads]


def batches(call: Any, slots: int = 1, max_size: int = 100, max_items: float = 100, instances: int = 1,
            busy: bool = True, alone: Any = None) -> Batches[int, int]:
    return Batches(call, slots, max_size, max_items, instances=instances, alone=alone, busy=lambda: busy)


async def submit(queue: Batches[int, int], *payloads: int, request_id: str = NO_REQUEST,
                 size: int = 1) -> list[int]:
    REQUEST_ID.set(request_id)  # each caller's own task
    return await queue.run([Item(p, size) for p in payloads])


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], dict[str, str]]]:
    """Each log line's message → the request id it was written under (as the processes' handlers have it)."""
    request_ids = RequestIdFilter()
    caplog.handler.addFilter(request_ids)
    caplog.set_level(logging.INFO)
    yield lambda: {record.getMessage(): record.request_id for record in caplog.records}
    caplog.handler.removeFilter(request_ids)


async def test_what_arrives_in_one_turn_leaves_together_and_a_busy_process_holds_the_rest() -> None:
    fake = FakeCall(fail=[4])
    queue = batches(fake, slots=1)
    first = asyncio.create_task(submit(queue, 1, 2))
    await settle()
    later = [asyncio.create_task(submit(queue, p)) for p in (3, 4, 5)]
    await settle()
    assert fake.calls == [[1, 2]]  # the rest wait for the one slot
    fake.release.set()
    assert await first == [2, 4]
    results = await asyncio.gather(*later, return_exceptions=True)
    assert fake.calls == [[1, 2], [3, 4, 5]]
    assert results[0] == [6] and results[2] == [10]
    assert isinstance(results[1], ValueError)  # its own failure, not the others'


async def test_a_process_with_cpu_to_spare_holds_nothing_back() -> None:
    fake = FakeCall()
    queue = batches(fake, slots=1, busy=False)
    tasks = [asyncio.create_task(submit(queue, 1))]
    await settle()
    tasks += [asyncio.create_task(submit(queue, p)) for p in (2, 3)]
    await settle()
    assert fake.calls == [[1], [2, 3]]  # each turn's items on their way, the slot notwithstanding
    fake.release.set()
    assert await asyncio.gather(*tasks) == [[2], [4], [6]]


async def test_calls_are_cut_by_items_and_by_size_and_a_large_item_goes_alone() -> None:
    fake = FakeCall()
    fake.release.set()
    by_items = batches(fake, slots=8, max_items=2)
    assert await submit(by_items, 1, 2, 3, 4, 5) == [2, 4, 6, 8, 10]
    assert fake.calls == [[1, 2], [3, 4], [5]]
    fake.calls.clear()
    by_size = batches(fake, slots=8, max_size=5)
    await asyncio.gather(submit(by_size, 1, size=2), submit(by_size, 2, size=9), submit(by_size, 3, size=3),
                         submit(by_size, 4, size=2))
    assert fake.calls == [[1], [2], [3, 4]]  # 2 + 9 is over the limit; 9 alone is larger, and goes


async def test_what_leaves_at_once_is_spread_in_equal_parts_over_the_idle_instances() -> None:
    fake = FakeCall()
    queue = batches(fake, slots=4, max_size=8, instances=2)
    first = [asyncio.create_task(submit(queue, p)) for p in range(1, 7)]
    await settle()
    assert fake.calls == [[1, 2, 3], [4, 5, 6]]
    later = [asyncio.create_task(submit(queue, p)) for p in (7, 8, 9)]
    await settle()
    assert fake.calls[2:] == [[7, 8, 9]]  # no instance idle: one call, up to the size limit
    fake.release.set()
    await asyncio.gather(*first, *later)


async def test_an_item_alone_makes_its_own_call_from_its_callers_task_in_a_slot() -> None:
    fake = FakeCall()
    fake.release.set()
    unary: list[tuple[int, str]] = []
    release_unary = asyncio.Event()

    async def alone(item: Item[int, int]) -> int:
        unary.append((item.payload, REQUEST_ID.get()))  # the caller's own context
        await release_unary.wait()
        return -item.payload

    queue = batches(fake, slots=1, alone=alone)
    first = asyncio.create_task(submit(queue, 1, request_id="a"))
    await settle()
    waiting = [asyncio.create_task(submit(queue, p, request_id=f"id-{p}")) for p in (2, 3)]
    await settle()
    assert unary == [(1, "a")] and fake.calls == []  # the others wait for its slot
    release_unary.set()
    assert await first == [-1]
    assert await asyncio.gather(*waiting) == [[4], [6]]
    assert fake.calls == [[2, 3]]


async def test_a_caller_that_goes_away_leaves_the_others_call_alone_and_the_last_one_cancels_it() -> None:
    fake = FakeCall()
    queue = batches(fake, slots=1)
    first = asyncio.create_task(submit(queue, 1))
    await settle()
    shared = [asyncio.create_task(submit(queue, p)) for p in (2, 3)]
    gone_before = asyncio.create_task(submit(queue, 4))
    await settle()
    gone_before.cancel()  # before its call leaves: it never reaches a call
    first.cancel()  # its call's only caller: the call is cancelled, and the waiting leave
    await settle()
    assert fake.cancelled == [[1]]
    assert fake.calls == [[1], [2, 3]]
    shared[0].cancel()
    await settle()
    assert fake.cancelled == [[1]]  # one caller of two gone: the call goes on
    shared[1].cancel()
    await settle()
    assert fake.cancelled == [[1], [2, 3]]
    await asyncio.gather(first, gone_before, *shared, return_exceptions=True)


async def test_a_call_with_the_wrong_number_of_answers_fails_each_of_its_items() -> None:
    async def short(items: list[Item[int, int]]) -> list[int]:
        return [0]

    with pytest.raises(RuntimeError, match="1 answers to a call of 2 items"):
        await submit(batches(short), 1, 2)


async def test_each_item_records_how_long_it_was_held_before_its_call_left() -> None:
    fake = FakeCall()
    queue = batches(fake, slots=1)
    first = asyncio.create_task(queue.run([Item(1)]))
    await settle()
    held = Item(2)
    waiting = asyncio.create_task(queue.run([held]))
    await settle()
    assert held.sent is None  # still held: the one slot is taken
    released = time.monotonic()
    fake.release.set()
    await asyncio.gather(first, waiting)
    assert held.sent is not None and held.sent >= released >= held.submitted
    assert held.held_s == held.sent - held.submitted


async def test_a_call_runs_in_its_own_context_under_the_joined_ids_of_its_requests(
        logged: Callable[[], dict[str, str]]) -> None:
    class Failing(FakeCall):
        async def __call__(self, items: list[Item[int, int]]) -> list[int | BaseException]:
            await super().__call__(items)
            log.error("the call for %d items failed", len(items))
            raise ConnectionError("down")

    fake = Failing()
    queue = batches(fake, slots=1)

    async def caller(payload: int, request_id: str) -> None:
        try:
            await submit(queue, payload, request_id=request_id)
        except ConnectionError:
            log.warning("item %d failed", payload)

    first = asyncio.create_task(caller(1, "a"))  # its arrival schedules the dispatch
    await settle()
    others = [asyncio.create_task(caller(p, rid)) for p, rid in ((2, "b"), (3, "c"), (4, "b"))]
    await settle()
    fake.release.set()
    await asyncio.gather(first, *others)
    assert fake.ids == ["a", "b,c"]  # not the id of the request whose arrival dispatched it
    assert logged() == {"the call for 1 items failed": "a", "the call for 3 items failed": "b,c",
                   "item 1 failed": "a", "item 2 failed": "b", "item 3 failed": "c", "item 4 failed": "b"}
    assert REQUEST_ID.get() == NO_REQUEST  # the test's own context is untouched


def test_a_joined_id_has_each_request_once_and_is_capped() -> None:
    assert joined_id(["a", "b", "a", NO_REQUEST, ""]) == "a,b"
    assert joined_id([NO_REQUEST]) == NO_REQUEST
    assert len(joined_id(f"{i:0>40}" for i in range(20))) == MAX_BATCH_IDS


async def test_a_batch_rpc_logs_each_failed_item_under_its_own_id(logged: Callable[[], dict[str, str]]) -> None:
    class Model:
        async def serve_many(self, requests: Sequence[Any], timeout: float | None) -> list[Any]:
            log.error("Triton failed")  # a line about the requests together
            return [ServiceError(grpc.StatusCode.UNAVAILABLE, f"no {request.texts.texts[0]}")
                    for request in requests]

    class Models:
        def get(self, name: str) -> Model:
            return Model()

    request = embed_pb2.EmbedBatchRequest(items=[
        embed_pb2.EmbedBatchItem(request=embed_pb2.EmbedRequest(model="m", texts=embed_pb2.TextBatch(texts=[t])),
                                 context=common_pb2.ItemContext(request_id=rid, timeout_s=5))
        for t, rid in (("x", "id-x"), ("y", "id-y"))])
    response = await serve_batch(Models(), request, ItemCalls(EMBED_CALL, "EmbedBatch"),  # type: ignore[arg-type]
                                 embed_pb2.EmbedBatchResult, embed_pb2.EmbedBatchResponse)
    assert [result.error.message for result in response.results] == ["no x", "no y"]
    assert logged() == {"Triton failed": "id-x,id-y", "UNAVAILABLE: no x": "id-x", "UNAVAILABLE: no y": "id-y"}
