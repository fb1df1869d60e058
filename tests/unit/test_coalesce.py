"""Batch-while-busy at the edge (edge/coalesce.py), against a fake service: an idle request goes at once as
a unary call; on a busy edge, requests that arrive while calls are in flight leave together in one batch
call; an edge with CPU to spare holds nothing back; each request keeps its own id, deadline and failure;
a caller that goes away leaves the others alone; a batch call runs under the ids of its requests."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import grpc
import pytest

from edge.coalesce import BatchCalls, Coalescer
from edge.errors import OpenAIError, from_grpc, from_item
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2
from tritongate.logs import REQUEST_ID, RequestIdFilter
from tritongate.wire import REQUEST_ID_KEY


class FakeService:
    """Unary and batch calls that wait until released; records what each call carried."""

    def __init__(self) -> None:
        self.release = asyncio.Event()  # the unary calls return
        self.release_batches = asyncio.Event()
        self.unary_calls: list[tuple[str, str]] = []  # (input, request id)
        self.batch_calls: list[list[tuple[str, str, float]]] = []  # per call: (input, request id, timeout)
        self.batch_ids: list[str] = []  # the request id each batch call ran under
        self.cancelled = 0
        self.fail_batches = False  # batch calls log an error and fail (INTERNAL)

    def answer(self, request: embed_pb2.EmbedRequest) -> embed_pb2.EmbedResponse:
        return embed_pb2.EmbedResponse(model=request.model, rows=len(request.texts.texts[0]))

    async def unary(self, request: embed_pb2.EmbedRequest, timeout: float, metadata: Any) -> embed_pb2.EmbedResponse:
        self.unary_calls.append((request.texts.texts[0], dict(metadata)[REQUEST_ID_KEY]))
        await self.release.wait()
        return self.answer(request)

    async def batch(self, request: embed_pb2.EmbedBatchRequest, timeout: float) -> embed_pb2.EmbedBatchResponse:
        self.batch_calls.append([(item.request.texts.texts[0], item.context.request_id, item.context.timeout_s)
                                 for item in request.items])
        self.batch_ids.append(REQUEST_ID.get())
        try:
            await self.release_batches.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail_batches:
            logging.getLogger("test.coalesce").error("the batch call failed")
            raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), "boom")
        results = []
        for item in request.items:
            if item.request.texts.texts[0] == "bad":
                error = common_pb2.ItemError(code=grpc.StatusCode.INVALID_ARGUMENT.value[0], message="input[0] is "
                                             "empty", param="input")
                results.append(embed_pb2.EmbedBatchResult(error=error))
            else:
                results.append(embed_pb2.EmbedBatchResult(response=self.answer(item.request)))
        return embed_pb2.EmbedBatchResponse(results=results)


def coalescer(service: FakeService, slots: int = 1, busy: bool = True) -> Coalescer:
    calls = BatchCalls(service.unary, service.batch, embed_pb2.EmbedBatchRequest, embed_pb2.EmbedBatchItem,
                       lambda request: len(request.texts.texts),
                       lambda exc: from_grpc(exc, "embed"), lambda error: from_item(error, "embed"))
    return Coalescer(calls, timeout=30.0, slots=slots, busy=lambda: busy)


async def call(coalescer: Coalescer, text: str, request_id: str) -> embed_pb2.EmbedResponse:
    REQUEST_ID.set(request_id)  # each caller's own task
    response: embed_pb2.EmbedResponse = await coalescer.call(embed_pb2.EmbedRequest(
        model="m", texts=embed_pb2.TextBatch(texts=[text])))
    return response


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_idle_goes_at_once_busy_ones_travel_together_each_with_its_id_and_failure() -> None:
    service = FakeService()
    coalesce = coalescer(service)
    first = asyncio.create_task(call(coalesce, "a", "id-a"))
    await settle()
    assert service.unary_calls == [("a", "id-a")]  # no wait, no batch, when nothing is in flight
    others = [asyncio.create_task(call(coalesce, text, f"id-{text}")) for text in ("bb", "bad", "dddd")]
    await settle()
    assert service.batch_calls == []  # they wait for the call in flight
    service.release.set()
    service.release_batches.set()
    assert (await first).rows == 1
    results = await asyncio.gather(*others, return_exceptions=True)
    assert [(text, rid) for text, rid, _ in service.batch_calls[0]] == [("bb", "id-bb"), ("bad", "id-bad"),
                                                                         ("dddd", "id-dddd")]
    assert all(0 < timeout <= 30.0 for _, _, timeout in service.batch_calls[0])
    assert isinstance(results[0], embed_pb2.EmbedResponse) and results[0].rows == 2
    assert isinstance(results[1], OpenAIError) and results[1].status == 400 and results[1].param == "input"
    assert isinstance(results[2], embed_pb2.EmbedResponse) and results[2].rows == 4


async def test_an_edge_with_cpu_to_spare_does_not_hold_requests_for_a_slot() -> None:
    service = FakeService()
    coalesce = coalescer(service, slots=1, busy=False)
    first = asyncio.create_task(call(coalesce, "a", "id-a"))
    await settle()
    second = asyncio.create_task(call(coalesce, "b", "id-b"))  # a later turn, the one slot taken
    await settle()
    assert service.unary_calls == [("a", "id-a"), ("b", "id-b")]  # both on their way
    together = [asyncio.create_task(call(coalesce, text, f"id-{text}")) for text in ("c", "dd")]
    await settle()
    assert [[text for text, _, _ in batch] for batch in service.batch_calls] == [["c", "dd"]]  # one turn
    service.release.set()
    service.release_batches.set()
    assert [r.rows for r in await asyncio.gather(first, second, *together)] == [1, 1, 1, 2]


async def test_a_caller_that_goes_away_leaves_the_others_call_alone() -> None:
    service = FakeService()
    coalesce = coalescer(service)
    first = asyncio.create_task(call(coalesce, "a", "id-a"))
    await settle()
    leaving, staying = (asyncio.create_task(call(coalesce, t, t)) for t in ("leaving", "staying"))
    await settle()
    service.release.set()
    await first
    await settle()
    assert len(service.batch_calls) == 1
    leaving.cancel()  # e.g. its client disconnected while the batch is in flight
    await settle()
    service.release_batches.set()
    assert (await staying).rows == len("staying") and service.cancelled == 0
    with pytest.raises(asyncio.CancelledError):
        await leaving


async def test_a_batch_whose_callers_all_went_away_is_cancelled() -> None:
    service = FakeService()
    coalesce = coalescer(service)
    first = asyncio.create_task(call(coalesce, "a", "id-a"))
    await settle()
    waiting = [asyncio.create_task(call(coalesce, t, t)) for t in ("b", "c")]
    await settle()
    service.release.set()
    await first
    await settle()
    assert len(service.batch_calls) == 1
    for task in waiting:
        task.cancel()
    await settle()
    assert service.cancelled == 1


async def test_requests_that_arrive_in_the_same_turn_leave_together_even_with_slots_free() -> None:
    service = FakeService()
    service.release_batches.set()
    coalesce = coalescer(service, slots=2)
    results = await asyncio.gather(*(call(coalesce, text, f"id-{text}") for text in ("a", "bb")))
    assert service.unary_calls == []
    assert [[(text, rid) for text, rid, _ in batch] for batch in service.batch_calls] == [
        [("a", "id-a"), ("bb", "id-bb")]]
    assert [result.rows for result in results] == [1, 2]


async def test_a_caller_cancelled_as_its_turn_to_go_alone_comes_gives_the_slot_back() -> None:
    service = FakeService()
    service.release.set()
    coalesce = coalescer(service, slots=1)
    alone = asyncio.create_task(call(coalesce, "a", "id-a"))
    await asyncio.sleep(0)  # queued; its dispatch is due next turn
    asyncio.get_running_loop().call_soon(alone.cancel)  # right after the dispatch picked it to go alone
    with pytest.raises(asyncio.CancelledError):
        await alone
    assert (await asyncio.wait_for(call(coalesce, "b", "id-b"), 1)).rows == 1  # the slot was given back
    assert service.unary_calls == [("b", "id-b")]


async def test_a_large_request_goes_alone_so_that_it_runs_beside_the_others() -> None:
    service = FakeService()
    service.release.set()
    service.release_batches.set()
    coalesce = coalescer(service, slots=2)

    async def large() -> embed_pb2.EmbedResponse:
        response: embed_pb2.EmbedResponse = await coalesce.call(embed_pb2.EmbedRequest(
            model="m", texts=embed_pb2.TextBatch(texts=["large"] * 64)))
        return response

    results = await asyncio.gather(large(), call(coalesce, "b", "id-b"))
    assert service.batch_calls == []  # 64 + 1 inputs are over the batch limit: two calls
    assert sorted(text for text, _ in service.unary_calls) == ["b", "large"]
    assert [result.rows for result in results] == [5, 1]


async def test_a_batch_call_runs_under_the_ids_of_its_requests_and_each_request_records_its_hold() -> None:
    service = FakeService()
    coalesce = coalescer(service)
    first = asyncio.create_task(call(coalesce, "a", "id-a"))  # its arrival schedules the first dispatch
    await settle()
    REQUEST_ID.set("id-b")
    held = coalesce.item(embed_pb2.EmbedRequest(model="m", texts=embed_pb2.TextBatch(texts=["b"])))
    others = [asyncio.create_task(coalesce.send(held)), asyncio.create_task(call(coalesce, "c", "id-c"))]
    await settle()
    assert held.sent is None  # held while the one slot is taken
    service.release.set()
    service.release_batches.set()
    await asyncio.gather(first, *others)
    assert service.batch_ids == ["id-b,id-c"]  # not "id-a", whose task dispatched it
    assert held.sent is not None and held.held_s == held.sent - held.submitted >= 0


async def test_a_failed_batch_call_is_logged_under_the_batchs_ids_and_each_failure_under_its_requests(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(RequestIdFilter())
    service = FakeService()
    service.release.set()
    service.release_batches.set()
    service.fail_batches = True
    coalesce = coalescer(service)
    first = asyncio.create_task(call(coalesce, "a", "id-a"))  # alone, in a unary call
    await asyncio.sleep(0)
    together = [asyncio.create_task(call(coalesce, text, f"id-{text}")) for text in ("b", "c")]
    results = await asyncio.gather(first, *together, return_exceptions=True)
    assert [[text for text, _, _ in batch] for batch in service.batch_calls] == [["b", "c"]]
    assert results[0].rows == 1  # type: ignore[union-attr]
    assert all(isinstance(r, OpenAIError) and r.status == 500 for r in results[1:]) and results[1] is not results[2]
    assert sorted((record.getMessage(), record.request_id) for record in caplog.records) == [
        ("embed service failed: INTERNAL boom", "id-b"), ("embed service failed: INTERNAL boom", "id-c"),
        ("the batch call failed", "id-b,id-c")]
