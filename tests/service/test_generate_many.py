"""GenerateMany against the real llm service and Triton: many generations on one stream, each served as
its own Generate call would be (its output, its failure with the parameter, its deadline, its admission
slot, its cancellation, its request id); and the edge's side of it (edge/many.py) on the same service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

import edge.many
from edge.errors import OpenAIError, from_item
from edge.many import GenerateStreams, ManyGeneration
from services.common.server import RunningService
from tests.service import test_llm_service as llm
from tests.service.test_llm_service import completion, events_since, ids, responses, texts
from tests.support.ports import wait_until
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc

Events = dict[int, list[llm_pb2.GenerateEvent]]

# The llm service's own tests' fixtures: the service on the session's Triton and its tokenizer (the stub on
# it comes from tests/service/conftest.py).
service, tokenizer = llm.service, llm.tokenizer


class Stream:
    """One GenerateMany call, written and read by the test."""

    def __init__(self, stub: llm_pb2_grpc.LlmServiceStub) -> None:
        self.outbox: asyncio.Queue[llm_pb2.GenerateCall | None] = asyncio.Queue()
        self.call = stub.GenerateMany(self._calls())
        self.events: Events = {}
        self.messages = 0

    async def _calls(self) -> AsyncIterator[llm_pb2.GenerateCall]:
        while (call := await self.outbox.get()) is not None:
            yield call

    def start(self, id: int, request: llm_pb2.GenerateRequest, request_id: str = "", timeout_s: float = 0) -> None:
        self.outbox.put_nowait(llm_pb2.GenerateCall(id=id, start=request, context=common_pb2.ItemContext(
            request_id=request_id, timeout_s=timeout_s)))

    def cancel(self, id: int) -> None:
        self.outbox.put_nowait(llm_pb2.GenerateCall(id=id, cancel=True))

    async def read_until(self, done: Any) -> None:
        """Read messages until `done(events)`."""
        while not done(self.events):
            message = await asyncio.wait_for(self.call.read(), 30)
            assert message is not grpc.aio.EOF  # type: ignore[attr-defined]
            self.messages += 1
            for event in message.events:
                self.events.setdefault(event.id, []).append(event)

    async def close(self) -> None:
        """Close our side; the stream ends once its generations have."""
        self.outbox.put_nowait(None)
        while (message := await asyncio.wait_for(self.call.read(), 30)) is not grpc.aio.EOF:  # type: ignore[attr-defined]
            for event in message.events:
                self.events.setdefault(event.id, []).append(event)
        assert await self.call.code() == grpc.StatusCode.OK


def ended(events: list[llm_pb2.GenerateEvent]) -> bool:
    return bool(events) and (events[-1].HasField("failure") or events[-1].response.HasField("usage"))


def all_ended(*ids_: int) -> Any:
    return lambda events: all(ended(events.get(i, [])) for i in ids_)


def handled(method: str, code: str) -> float:
    return REGISTRY.get_sample_value("grpc_server_handled_total", {
        "grpc_service": "tritongate.llm.v1.LlmService", "grpc_method": method, "grpc_type": "server_stream",
        "grpc_code": code}) or 0.0


@pytest.fixture
async def stream(stub: llm_pb2_grpc.LlmServiceStub) -> AsyncIterator[Stream]:
    opened = Stream(stub)
    yield opened
    opened.call.cancel()


async def test_each_generation_is_what_its_own_generate_call_gives(stub: llm_pb2_grpc.LlmServiceStub,
                                                                    stream: Stream, tokenizer: Any) -> None:
    requests = {0: completion("ft-echo-slow", ids(tokenizer, "one two three"), n=2, max_tokens=5),
                1: completion("ft-echo", "Hello world!", max_tokens=7),
                2: completion("ft-echo", "x", n=17),
                3: completion("nope", "x")}
    for id, request in requests.items():
        stream.start(id, request)
    await stream.read_until(all_ended(*requests))
    for id in (0, 1):
        alone = await responses(stub, requests[id])
        together = [event.response for event in stream.events[id]]
        assert [m.WhichOneof("event") for m in together][::len(together) - 1] == ["accepted", "usage"]
        assert [texts(together, i) for i in range(2)] == [texts(alone, i) for i in range(2)]
        assert together[-1].usage == alone[-1].usage
    assert [event.WhichOneof("event") for event in stream.events[2]] == ["failure"]
    refused = stream.events[2][0].failure
    assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and refused.param == "n"
    assert "between 1 and 16" in refused.message
    assert stream.events[3][0].failure.param == "model" and stream.events[3][0].failure.error_code == "model_not_found"
    await stream.close()


async def test_events_of_several_generations_share_messages(stream: Stream) -> None:
    for id in range(16):
        stream.start(id, completion("ft-echo", "one two three four five six", max_tokens=30))
    await stream.read_until(all_ended(*range(16)))
    events = sum(len(events) for events in stream.events.values())
    assert stream.messages < events  # fewer messages than events: each message carried several
    await stream.close()


async def test_cancelling_one_generation_leaves_the_others(stream: Stream, events_file: Path) -> None:
    offset = len(events_file.read_text())  # noqa: ASYNC240 (a small local file)
    cancelled = handled("Generate", "CANCELLED")
    stream.start(0, completion("ft-echo-slow", "tick tock", max_tokens=200), request_id="rid-many")
    stream.start(1, completion("ft-echo-slow", "tick tock", max_tokens=6))
    await stream.read_until(lambda events: len(events.get(0, [])) >= 4)
    stream.cancel(0)
    await stream.read_until(all_ended(1))
    await stream.close()  # ends only once the cancelled generation has ended too
    assert not ended(stream.events[0]) and texts([e.response for e in stream.events[1]]) == "tick tocktick tock"
    assert handled("Generate", "CANCELLED") == cancelled + 1

    def seen() -> list[dict[str, Any]]:
        return [e for e in events_since(events_file, offset) if e["request_id"] == "rid-many-0"]

    # Triton saw the request id of the generation's context, and the cancellation.
    await asyncio.to_thread(wait_until, lambda: any(e["event"] == "cancelled" for e in seen()), 10, "the cancellation")


async def test_a_generation_past_its_deadline_fails_alone(stream: Stream) -> None:
    stream.start(0, completion("ft-echo-slow", "tick tock", max_tokens=200), timeout_s=0.3)
    stream.start(1, completion("ft-echo", "tick tock", max_tokens=4), timeout_s=30)
    await stream.read_until(all_ended(0, 1))
    assert stream.events[0][-1].failure.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert stream.events[1][-1].response.usage.completion_tokens == 4
    await stream.close()


async def test_admission_refuses_a_generation_beyond_the_limit(service: RunningService, stream: Stream) -> None:
    admission = service.servicer.admission
    assert admission is not None
    overloaded = handled("Generate", "RESOURCE_EXHAUSTED")
    admission.limit, limit = admission.in_flight, admission.limit  # no slot left
    try:
        stream.start(0, completion("ft-echo", "x", max_tokens=2))
        await stream.read_until(all_ended(0))
    finally:
        admission.limit = limit
    refused = stream.events[0][0].failure
    assert refused.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and refused.error_code == "overloaded"
    assert handled("Generate", "RESOURCE_EXHAUSTED") == overloaded + 1
    stream.start(1, completion("ft-echo", "x", max_tokens=2))  # the stream still serves
    await stream.read_until(all_ended(1))
    assert stream.events[1][-1].response.usage.completion_tokens == 2
    assert admission.in_flight == 0  # every slot given back
    await stream.close()


async def test_a_draining_service_refuses_new_generations_and_ends_its_streams(service: RunningService,
                                                                                stream: Stream) -> None:
    stream.start(0, completion("ft-echo-slow", "tick tock", max_tokens=6))
    await stream.read_until(lambda events: len(events.get(0, [])) >= 2)  # accepted and under way
    service.servicer.stopping.set()
    try:
        stream.start(1, completion("ft-echo", "x", max_tokens=2))
        await stream.read_until(all_ended(0, 1))
        # Once its last generation has ended, the stream ends, though this side never closed it.
        assert await asyncio.wait_for(stream.call.read(), 10) is grpc.aio.EOF  # type: ignore[attr-defined]
    finally:
        service.servicer.stopping.clear()
    assert stream.events[1][0].failure.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert texts([e.response for e in stream.events[0]]) == "tick tocktick tock"  # the one in flight finished
    assert await stream.call.code() == grpc.StatusCode.OK


async def test_an_id_in_flight_cannot_start_again(stream: Stream) -> None:
    stream.start(0, completion("ft-echo-slow", "tick tock", max_tokens=4))
    stream.start(0, completion("ft-echo", "x", max_tokens=2))
    await stream.read_until(lambda events: len(events.get(0, [])) >= 2 and any(
        e.HasField("failure") for e in events[0]) and events[0][-1].response.HasField("usage"))
    failures = [e.failure for e in stream.events[0] if e.HasField("failure")]
    assert len(failures) == 1 and "already in flight" in failures[0].message
    await stream.close()


# The edge's side: edge/many.py's streams on the same service.


@pytest.fixture
async def streams(service: RunningService) -> AsyncIterator[GenerateStreams]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        opened = GenerateStreams(llm_pb2_grpc.LlmServiceStub(channel), 2, lambda error: from_item(error, "llm"))
        yield opened
        await opened.close()


async def collect(generation: ManyGeneration) -> list[llm_pb2.GenerateResponse]:
    messages = []
    while (message := await generation.next()) is not None:
        messages.append(message)
    return messages


def started(method: str) -> float:
    return REGISTRY.get_sample_value("grpc_server_started_total", {
        "grpc_service": "tritongate.llm.v1.LlmService", "grpc_method": method, "grpc_type": "bidi_stream"}) or 0.0


async def test_the_edge_spreads_generations_over_its_streams(streams: GenerateStreams, stub: Any) -> None:
    opened = started("GenerateMany")
    requests = [completion("ft-echo", f"prompt number {i}", max_tokens=6) for i in range(6)]
    generations = [ManyGeneration(streams, request, common_pb2.ItemContext(timeout_s=30)) for request in requests]
    results = await asyncio.gather(*(collect(generation) for generation in generations))
    for request, messages in zip(requests, results, strict=True):
        assert texts(messages) == texts(await responses(stub, request))
    assert started("GenerateMany") == opened + 2  # two streams, each carrying three generations
    assert all(stream is not None and not stream.generations for stream in streams.open)


async def test_the_edge_retires_old_streams_and_closes_them_when_done(streams: GenerateStreams,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(edge.many, "STREAM_AGE_S", 0.0)  # every stream too old for the next generation
    opened = started("GenerateMany")
    first = ManyGeneration(streams, completion("ft-echo-slow", "tick tock", max_tokens=6), common_pb2.ItemContext())
    second = ManyGeneration(streams, completion("ft-echo", "x", max_tokens=2), common_pb2.ItemContext())
    third = ManyGeneration(streams, completion("ft-echo", "y", max_tokens=2), common_pb2.ItemContext())
    assert first.stream is not third.stream and first.stream.retired  # the third took the first's place
    assert streams.draining == {first.stream}
    assert texts(await collect(first)) == "tick tocktick tock" and texts(await collect(second)) == "xx"
    await collect(third)
    await asyncio.wait_for(first.stream.reader, 10)  # its last generation ended: the stream closed
    assert await first.stream.call.code() == grpc.StatusCode.OK and not streams.draining
    assert started("GenerateMany") == opened + 3


async def test_the_edge_cancels_and_starts_an_unavailable_generation_once_more(
        service: RunningService, streams: GenerateStreams) -> None:
    generation = ManyGeneration(streams, completion("ft-echo-slow", "tick tock", max_tokens=200),
                                common_pb2.ItemContext(request_id="rid-edge"))
    assert (await generation.next()) is not None  # accepted
    cancelled = handled("Generate", "CANCELLED")
    generation.cancel()
    await asyncio.to_thread(wait_until, lambda: handled("Generate", "CANCELLED") == cancelled + 1, 10,
                            "the service's side cancelled")
    opened = started("GenerateMany")
    service.servicer.stopping.set()  # the idle streams end; new generations are refused
    try:
        idle = streams.open[0]
        assert idle is not None
        await asyncio.wait_for(idle.reader, 10)  # the idle stream ended, and the edge retired it
        assert idle.retired and await idle.call.code() == grpc.StatusCode.OK
        refused = ManyGeneration(streams, completion("ft-echo", "x", max_tokens=2), common_pb2.ItemContext())
        with pytest.raises(OpenAIError) as info:
            await refused.next()
    finally:
        service.servicer.stopping.clear()
    assert info.value.status == 503 and refused.retried
    assert started("GenerateMany") == opened + 2  # tried twice, each time on a new stream
