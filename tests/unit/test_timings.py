"""Where a request's time went: the stages the services measure (the encoder batcher's queue and inference,
tokenization, a generation's streams), the edge's hold in its coalescer, and how the edge shows them
(`Server-Timing`), logs them and counts them. Clocks are fakes where a stage's length is asserted."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from fastapi.testclient import TestClient

from edge import telemetry
from edge.coalesce import BatchCalls, Coalescer
from edge.errors import OpenAIError
from edge.telemetry import STAGE_LATENCY, Exchange, HttpMetrics, server_timing
from services.common.encoder import Batcher, EncoderModel, Row
from services.common.metrics import Stages
from tests.support.clock import Clock
from tests.unit.test_llm_model import VLLM, chat, generate, model, serving, vllm_steps
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2
from tritongate.logs import formatter


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    fake = Clock(100.0)
    monkeypatch.setattr(time, "perf_counter", fake)  # the services' tokenization
    monkeypatch.setattr(time, "monotonic", fake)  # the batching's hold and queue (and the loop's clock: no timers)
    yield fake


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


# The services' stages


def test_stages_add_up_tokenization_and_leave_absent_stages_unset(clock: Clock) -> None:
    stages = Stages()
    for spent in (0.5, 0.25):
        with stages.tokenizing():
            clock.now += spent
    assert stages.tokenization == 0.75
    timings = stages.proto()
    assert timings.tokenization_s == 0.75
    assert not timings.HasField("queue_s") and not timings.HasField("inference_s")


class Calls:
    """A fake model call per batch, each returning when released."""

    def __init__(self) -> None:
        self.released: list[asyncio.Event] = []

    async def __call__(self, rows: list[Row]) -> np.ndarray:
        self.released.append(asyncio.Event())
        await self.released[-1].wait()
        return np.array([[row.input_ids[0]] for row in rows], dtype=np.float32)


async def test_the_batcher_splits_a_request_s_time_into_queue_and_inference(clock: Clock) -> None:
    calls = Calls()
    batcher = Batcher(calls, batch_size=8, slots=1, busy=lambda: True)
    first, second = Stages(), Stages()
    a = asyncio.create_task(batcher.submit([Row([1])], first))
    await settle()  # its call starts at once
    clock.now += 2
    b = asyncio.create_task(batcher.submit([Row([2])], second))
    await settle()  # no slot: it waits for the first call
    clock.now += 3
    calls.released[0].set()
    await settle()  # the first answered, the second's call starts
    clock.now += 4
    calls.released[1].set()
    await asyncio.gather(a, b)
    assert (first.queue, first.inference) == (0.0, 5.0)
    assert (second.queue, second.inference) == (3.0, 4.0)
    assert first.tokenization is None  # not the batcher's to measure


async def test_a_request_split_over_calls_queues_until_its_last_call_starts(clock: Clock) -> None:
    calls = Calls()
    batcher = Batcher(calls, batch_size=1, slots=1, busy=lambda: True)
    stages = Stages()
    task = asyncio.create_task(batcher.submit([Row([1]), Row([2])], stages))
    await settle()
    clock.now += 1
    calls.released[0].set()
    await settle()
    clock.now += 2
    calls.released[1].set()
    assert (await task).ravel().tolist() == [1, 2]
    assert (stages.queue, stages.inference) == (1.0, 2.0)


class Encoder(EncoderModel):
    """Only what EncoderModel.serve_many uses: a batch tokenized in one call, each request served."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.served: list[Stages] = []

    def encode_many(self, requests: Any) -> list[Any]:
        self.clock.now += 0.5
        return [f"tokens of {r}" for r in requests]

    async def serve(self, request: Any, timeout: float | None, encoded: Any = None, stages: Stages | None = None
                    ) -> Any:
        assert stages is not None
        stages.queue = float(len(self.served))  # each request's own later stages
        self.served.append(stages)
        return encoded


async def test_a_batch_rpc_s_items_each_count_their_shared_tokenization_and_own_the_rest(clock: Clock) -> None:
    encoder = Encoder(clock)
    assert await encoder.serve_many(["a", "b"], None) == ["tokens of a", "tokens of b"]
    first, second = encoder.served
    assert first is not second
    assert first.tokenization == second.tokenization == 0.5
    assert (first.queue, second.queue) == (0.0, 1.0)


async def test_a_generation_reports_tokenization_first_and_inference_last(models_dir: Path) -> None:
    async with serving(VLLM, vllm_steps(("Hello", 1, "None"), (" world", 1, "length"))) as triton:
        responses = await generate(model(models_dir, triton), chat=chat("Hi"), max_tokens=2)
    first, last = responses[0].timings, responses[-1].timings
    assert responses[0].WhichOneof("event") == "accepted" and responses[-1].WhichOneof("event") == "usage"
    assert first.tokenization_s > 0 and not first.HasField("inference_s")
    assert last.tokenization_s == first.tokenization_s and last.inference_s >= 0
    assert not first.HasField("queue_s") and not last.HasField("queue_s")  # no batcher in front of an LLM
    assert not any(r.HasField("timings") for r in responses[1:-1])


# The edge's hold


class Service:
    """A unary and a batch embed call, each returning when released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def unary(self, request: embed_pb2.EmbedRequest, timeout: float, metadata: Any) -> embed_pb2.EmbedResponse:
        await self.release.wait()
        return embed_pb2.EmbedResponse(model=request.model)

    async def batch(self, request: embed_pb2.EmbedBatchRequest, timeout: float) -> embed_pb2.EmbedBatchResponse:
        await self.release.wait()
        return embed_pb2.EmbedBatchResponse(results=[embed_pb2.EmbedBatchResult(
            response=embed_pb2.EmbedResponse(model=item.request.model)) for item in request.items])


async def test_the_coalescer_records_each_request_s_hold_until_its_call_left(clock: Clock) -> None:
    service = Service()
    calls = BatchCalls(service.unary, service.batch, embed_pb2.EmbedBatchRequest, embed_pb2.EmbedBatchItem,
                       lambda request: 1, lambda exc: OpenAIError(503, "down"), lambda error: OpenAIError(400, "bad"))
    coalescer = Coalescer(calls, timeout=30.0, slots=1, busy=lambda: True)
    exchanges = [Exchange(f"r{i}", 0.0) for i in range(3)]

    async def call(exchange: Exchange) -> None:
        telemetry.EXCHANGE.set(exchange)  # each caller's own task
        await coalescer.call(embed_pb2.EmbedRequest(model="m"))

    alone = asyncio.create_task(call(exchanges[0]))
    await settle()  # idle: it leaves at once, alone
    clock.now += 1
    together = [asyncio.create_task(call(exchange)) for exchange in exchanges[1:]]
    await settle()  # the slot is taken: they wait
    clock.now += 2
    service.release.set()
    await asyncio.gather(alone, *together)
    assert [exchange.hold for exchange in exchanges] == [0.0, 2.0, 2.0]


# What the edge shows, logs and counts


def test_an_exchange_keeps_the_stages_a_service_leaves_unset() -> None:
    exchange = Exchange("r", 0.0, hold=0.001)
    exchange.record_timings(common_pb2.Timings(tokenization_s=0.002))
    exchange.record_timings(common_pb2.Timings(inference_s=0.25))  # a stream's last message
    assert exchange.timings_ms(None) == [("hold", 1.0), ("tokenization", 2.0), ("inference", 250.0)]
    exchange.ttft = 0.1
    assert exchange.timings_ms(0.3)[-2:] == [("ttft", 100.0), ("total", 300.0)]


def test_server_timing_is_w3c_syntax_in_milliseconds() -> None:
    assert server_timing([("queue", 1.23456), ("total", 12.0)]) == b"queue;dur=1.23, total;dur=12.00"
    assert server_timing([]) == b""


def stage_count(model: str, stage: str) -> float:
    return sum(sample.value for metric in STAGE_LATENCY.collect() for sample in metric.samples
               if sample.name.endswith("_count") and sample.labels == {"model": model, "stage": stage})


def app_with_stages(**stages: float) -> FastAPI:
    app = FastAPI()

    def record() -> None:
        exchange = telemetry.current()
        exchange.model = "stage-test-model"
        for name, seconds in stages.items():
            setattr(exchange, name, seconds)

    @app.get("/whole")
    async def whole() -> Response:
        record()
        return Response(b"{}", media_type="application/json")

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        record()

        async def body() -> Any:
            telemetry.current().inference = 0.5  # learned after the headers went out
            yield b"data: 1\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    app.add_middleware(HttpMetrics)
    return app


def timing_header(value: str) -> dict[str, float]:
    entries = (entry.strip().split(";dur=") for entry in value.split(","))
    return {name: float(ms) for name, ms in entries}


def test_a_whole_response_carries_every_stage_and_the_total(caplog: pytest.LogCaptureFixture) -> None:
    before = stage_count("stage-test-model", "queue")
    with TestClient(app_with_stages(hold=0.001, queue=0.002, tokenization=0.0005, inference=0.004)) as client, \
            caplog.at_level(logging.INFO, "tritongate.access"):
        response = client.get("/whole")
    timings = timing_header(response.headers["server-timing"])
    assert list(timings) == ["hold", "tokenization", "queue", "inference", "total"]
    assert (timings["hold"], timings["queue"], timings["tokenization"], timings["inference"]) == (1, 2, 0.5, 4)
    assert timings["total"] >= 0
    (record,) = [r for r in caplog.records if r.name == "tritongate.access"]
    assert record.getMessage().endswith(" hold=1.00ms tokenization=0.50ms queue=2.00ms inference=4.00ms")
    line = json.loads(formatter(json_lines=True).format(record))
    assert (line["hold_ms"], line["queue_ms"], line["tokenization_ms"], line["inference_ms"]) == (1, 2, 0.5, 4)
    assert line["ttft_ms"] is None
    assert stage_count("stage-test-model", "queue") == before + 1


def test_a_stream_s_header_has_what_came_before_it_and_the_log_has_the_rest(caplog: pytest.LogCaptureFixture
                                                                             ) -> None:
    before = stage_count("stage-test-model", "inference")
    with TestClient(app_with_stages(tokenization=0.003)) as client, caplog.at_level(logging.INFO, "tritongate.access"):
        response = client.get("/stream")
    assert timing_header(response.headers["server-timing"]) == {"tokenization": 3.0}  # no total: not over yet
    (record,) = [r for r in caplog.records if r.name == "tritongate.access"]
    assert record.getMessage().endswith(" tokenization=3.00ms inference=500.00ms")
    assert stage_count("stage-test-model", "inference") == before + 1


def test_a_response_without_stages_carries_its_total_only() -> None:
    with TestClient(app_with_stages()) as client:
        assert list(timing_header(client.get("/whole").headers["server-timing"])) == ["total"]
        assert "server-timing" not in client.get("/stream").headers  # nothing known before a stream

