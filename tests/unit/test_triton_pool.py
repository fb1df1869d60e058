"""A model's pool of Triton endpoints (services/common/triton_pool.py) and the calls spread over them
(services/common/triton.py): picking by calls in flight, out on a failure or a readiness check that says
no, back in when ready again, DNS names looked up again, retries on another endpoint. Triton's clients
are scripted fakes here; tests/e2e/test_triton_replicas.py runs two real Tritons."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncIterator
from contextlib import ExitStack
from typing import Any

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException

from services.common.errors import ServiceError
from services.common.triton import Triton
from services.common.triton_pool import ReadinessCheck, ReadinessUnknown, TritonPool, resolve
from tritongate.triton_address import TritonAddress, parse_triton_address

A, B, C = "10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.3:8001"
NOT_READY = "Triton reports it not ready"
model_ids = (f"model-{i}" for i in itertools.count())  # one per test: the metrics are the process's


def pool_of(*addresses: str) -> TritonPool:
    return TritonPool([parse_triton_address(address) for address in addresses], next(model_ids))


def readiness(states: dict[str, str | Exception | None]) -> ReadinessCheck:
    """A readiness check answering from `states` (an address → None: ready, why not, or what to raise)."""
    async def check(address: str) -> str | None:
        state = states[address]
        if isinstance(state, Exception):
            raise state
        return state
    return check


async def ready_pool(*addresses: str) -> TritonPool:
    pool = pool_of(*addresses)
    assert await pool.refresh(readiness(dict.fromkeys(addresses))) is None
    return pool


def sample(name: str, pool: TritonPool, address: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"model": pool.name, "endpoint": address})


async def test_calls_go_to_the_endpoint_with_fewest_in_flight_and_equals_take_turns() -> None:
    pool = await ready_pool(A, B, C)
    assert [pool.pick().address for _ in range(6)] == [A, B, C, A, B, C]  # type: ignore[union-attr]
    a = pool.endpoints[A]
    with pool.calling(a), pool.calling(a):
        assert a.in_flight == 2 and sample("tritongate_triton_endpoint_in_flight", pool, A) == 2
        assert [pool.pick().address for _ in range(4)] == [B, C, B, C]  # type: ignore[union-attr]
    assert a.in_flight == 0 and sample("tritongate_triton_endpoint_in_flight", pool, A) == 0
    assert sample("tritongate_triton_endpoint_calls_total", pool, A) == 2
    assert pool.pick(avoid=pool.endpoints[A]).address != A  # type: ignore[union-attr]


async def test_a_slow_endpoint_gets_fewer_calls() -> None:
    """Eight calls always in flight; a call takes 1 step on A and 10 on B (both have the model ready)."""
    pool = await ready_pool(A, B)
    steps = {A: 1, B: 10}
    running: list[tuple[int, ExitStack]] = []  # (step it ends at, its in-flight count)
    picked = {A: 0, B: 0}
    for now in range(2000):
        for ends, call in [(ends, call) for ends, call in running if ends <= now]:
            running.remove((ends, call))
            call.close()
        while len(running) < 8:
            endpoint = pool.pick()
            assert endpoint is not None
            picked[endpoint.address] += 1
            call = ExitStack()
            call.enter_context(pool.calling(endpoint))
            running.append((now + steps[endpoint.address], call))
    # Equal calls in flight: each endpoint takes calls as fast as it ends them (round robin: half each).
    assert picked[B] * 5 < picked[A], picked


async def test_an_endpoint_is_taken_out_when_not_ready_and_put_back_when_ready(
        caplog: pytest.LogCaptureFixture) -> None:
    pool = pool_of(A, B)
    states: dict[str, str | Exception | None] = {A: None, B: NOT_READY}
    with caplog.at_level(logging.INFO, logger="services.common.triton_pool"):
        assert await pool.refresh(readiness(states)) is None  # the model is ready: one endpoint has it
        assert [e.address for e in pool.ready()] == [A]
        assert f"Triton endpoint {B} is not ready: {NOT_READY} (1 of 2 ready)" in caplog.text  # named once
        assert await pool.refresh(readiness(states)) is None
        assert caplog.text.count(f"{B} is not ready") == 1
        states[B] = None
        assert await pool.refresh(readiness(states)) is None
        assert f"Triton endpoint {B} is ready: in the rotation (2 of 2 ready)" in caplog.text
        states[A] = "Triton did not answer (StatusCode.UNAVAILABLE)"
        assert await pool.refresh(readiness(states)) is None
    assert f"Triton endpoint {A} taken out of the rotation: Triton did not answer" in caplog.text
    assert sample("tritongate_triton_endpoint_ejections_total", pool, A) == 1
    assert sample("tritongate_triton_endpoint_ready", pool, A) == 0
    assert sample("tritongate_triton_endpoint_ready", pool, B) == 1
    assert all(pool.pick().address == B for _ in range(3))  # type: ignore[union-attr]
    states[B] = NOT_READY
    assert await pool.refresh(readiness(states)) == (
        f"no endpoint is ready ({A}: Triton did not answer (StatusCode.UNAVAILABLE); {B}: {NOT_READY})")
    assert pool.pick() is None


async def test_a_ready_endpoint_outlasts_two_unanswered_readiness_checks_not_three() -> None:
    pool = await ready_pool(A, B)
    states: dict[str, str | Exception | None] = {A: ReadinessUnknown("no answer within 2 s"), B: None}
    for _ in range(2):
        await pool.refresh(readiness(states))
        assert pool.endpoints[A].ready  # a busy Triton answers late
    await pool.refresh(readiness(states))
    assert not pool.endpoints[A].ready
    assert pool.endpoints[A].why_not == "Triton gave its readiness check no answer within 2 s (3 in a row)"
    states[A] = None
    assert await pool.refresh(readiness(states)) is None and pool.endpoints[A].ready
    states[A] = ReadinessUnknown("no answer within 2 s")  # the count starts again after an answer
    await pool.refresh(readiness(states))
    assert pool.endpoints[A].ready


class Dns:
    """A resolver answering from `answer` (a list of addresses, or an exception to raise)."""

    def __init__(self, answer: list[str] | Exception) -> None:
        self.answer = answer
        self.lookups = 0

    async def __call__(self, host: str, port: int) -> list[str]:
        self.lookups += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def test_a_dns_name_is_looked_up_again_and_its_endpoints_follow(caplog: pytest.LogCaptureFixture) -> None:
    dns = Dns([A, B])
    pool = TritonPool([TritonAddress("triton", 8001, dns=True)], next(model_ids), resolve_every_s=0, resolver=dns)
    all_ready = readiness(dict.fromkeys([A, B, C]))
    assert await pool.refresh(all_ready) is None
    assert [e.address for e in pool.ready()] == [A, B]  # checked as soon as found
    with pool.calling(pool.endpoints[A]):
        dns.answer = [B, C]  # a pod went, another came
        with caplog.at_level(logging.INFO, logger="services.common.triton_pool"):
            assert await pool.refresh(all_ready) is None
        assert [e.address for e in pool.ready()] == [B, C]  # the new one checked at once
        assert {pool.pick().address for _ in range(2)} == {B, C}  # type: ignore[union-attr]
    assert f"dns:///triton:8001 resolves to ['{B}', '{C}'] (was ['{A}', '{B}'])" in caplog.text
    assert f"Triton endpoint {A} left (1 in flight there)" in caplog.text
    assert sample("tritongate_triton_endpoint_ready", pool, A) is None  # its series are gone
    assert sample("tritongate_triton_endpoint_in_flight", pool, A) is None

    dns.answer = OSError("Temporary failure in name resolution")
    with caplog.at_level(logging.WARNING, logger="services.common.triton_pool"):
        assert await pool.refresh(all_ready) is None
        assert await pool.refresh(all_ready) is None
    assert [e.address for e in pool] == [B, C]  # the last answer is kept; readiness says if they still serve
    assert caplog.text.count("cannot resolve dns:///triton:8001: Temporary failure in name resolution") == 1
    dns.answer = []
    assert await pool.refresh(all_ready) == "dns:///triton:8001 resolves to no address"


async def test_dns_names_are_looked_up_at_most_every_interval() -> None:
    dns = Dns(OSError("Name or service not known"))
    pool = TritonPool([TritonAddress("nowhere", 8001, dns=True)], next(model_ids), resolve_every_s=60, resolver=dns)
    why = await pool.refresh(readiness({}))
    assert why == "dns:///nowhere:8001 resolves to no address (dns:///nowhere:8001: Name or service not known)"
    await pool.refresh(readiness({}))
    assert dns.lookups == 1


async def test_names_resolve_with_the_systems_resolver() -> None:
    assert "127.0.0.1:8001" in await resolve("localhost", 8001)


# Triton's calls, on scripted clients.

def result(value: float) -> InferResult:
    response = service_pb2.ModelInferResponse(model_name="m")
    response.outputs.add(name="y", datatype="FP32", shape=[1])
    response.raw_output_contents.append(np.array([value], dtype=np.float32).tobytes())
    return InferResult(response)


UNAVAILABLE = InferenceServerException("failed to connect to all addresses", "StatusCode.UNAVAILABLE")


class Call:
    """A scripted stream: each item a result to answer, or an exception to raise."""

    def __init__(self, items: list[InferResult | Exception]) -> None:
        self.items = items
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[tuple[InferResult, None]]:
        return self._responses()

    async def _responses(self) -> AsyncIterator[tuple[InferResult, None]]:
        for item in self.items:
            if isinstance(item, Exception):
                raise item
            yield item, None

    def cancel(self) -> None:
        self.cancelled = True


class Client:
    """A tritonclient aio client that answers `infer` with `answer` and streams with `stream`."""

    def __init__(self, answer: InferResult | Exception = UNAVAILABLE, stream: list[Any] | None = None) -> None:
        self.answer, self.calls, self.closed = answer, 0, False
        self.stream = Call(stream or [])

    async def infer(self, model: str, inputs: Any, **kwargs: Any) -> InferResult:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer

    def stream_infer(self, requests: Any, stream_timeout: float | None) -> Call:
        self.calls += 1
        return self.stream

    async def close(self) -> None:
        self.closed = True


def triton_with(clients: dict[str, Client]) -> Triton:
    triton = Triton()
    triton._clients.update(clients)  # type: ignore[arg-type]
    return triton


INPUTS = {"x": np.zeros((1, 1), dtype=np.float32)}


async def test_an_inference_found_unavailable_is_retried_once_on_another_endpoint() -> None:
    pool = await ready_pool(A, B)
    clients = {A: Client(UNAVAILABLE), B: Client(result(2.0))}
    triton = triton_with(clients)
    output = await triton.infer(pool, "m", INPUTS, ["y"])
    assert output["y"].tolist() == [2.0]
    assert [e.address for e in pool.ready()] == [B]  # A is out until a readiness check finds it ready
    assert triton._unreachable.is_set()  # which the readiness watcher does at once
    assert {address: endpoint.in_flight for address, endpoint in pool.endpoints.items()} == {A: 0, B: 0}
    assert sample("tritongate_triton_endpoint_calls_total", pool, A) == 1
    await triton.infer(pool, "m", INPUTS, ["y"])
    assert clients[A].calls == 1 and clients[B].calls == 2


async def test_an_inference_fails_when_its_retry_fails_or_its_failure_is_not_unavailability() -> None:
    pool = await ready_pool(A, B)
    triton = triton_with({A: Client(UNAVAILABLE), B: Client(UNAVAILABLE)})
    with pytest.raises(ServiceError) as info:
        await triton.infer(pool, "m", INPUTS, ["y"])
    assert info.value.code == grpc.StatusCode.UNAVAILABLE and not pool.ready()
    with pytest.raises(ServiceError) as info:
        await triton.infer(pool, "m", INPUTS, ["y"])
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert info.value.message == "Triton model `m` is unavailable: no Triton endpoint has it ready"

    pool = await ready_pool(A, B)
    broken = InferenceServerException("ZeroDivisionError: division by zero", "StatusCode.INTERNAL")
    clients = {A: Client(broken), B: Client(broken)}
    with pytest.raises(ServiceError) as info:
        await triton_with(clients).infer(pool, "m", INPUTS, ["y"])
    assert info.value.code == grpc.StatusCode.INTERNAL  # the request's own failure: once, and no ejection
    assert sum(client.calls for client in clients.values()) == 1 and len(pool.ready()) == 2


def unavailable_stream() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(),
                                "failed to connect to all addresses")


async def collect(stream: AsyncIterator[dict[str, np.ndarray]]) -> list[float]:
    return [float(response["y"][0]) async for response in stream]


async def test_a_stream_is_retried_on_another_endpoint_only_before_its_first_response() -> None:
    pool = await ready_pool(A, B)
    clients = {A: Client(stream=[unavailable_stream()]), B: Client(stream=[result(1.0), result(2.0)])}
    assert await collect(triton_with(clients).stream(pool, "m", INPUTS, ["y"])) == [1.0, 2.0]
    assert [e.address for e in pool.ready()] == [B]

    pool = await ready_pool(A, B)
    clients = {A: Client(stream=[result(1.0), unavailable_stream()]), B: Client(stream=[result(9.0)])}
    received: list[float] = []
    with pytest.raises(ServiceError) as info:
        async for response in triton_with(clients).stream(pool, "m", INPUTS, ["y"]):
            received.append(float(response["y"][0]))
    assert info.value.code == grpc.StatusCode.UNAVAILABLE
    assert received == [1.0] and clients[B].calls == 0  # what was sent cannot be taken back: no retry
    assert pool.endpoints[A].in_flight == 0 and clients[A].stream.cancelled


async def test_closing_a_stream_cancels_its_call_and_ends_its_count_in_flight() -> None:
    pool = await ready_pool(A)
    client = Client(stream=[result(1.0), result(2.0)])
    stream = triton_with({A: client}).stream(pool, "m", INPUTS, ["y"])
    assert float((await anext(stream))["y"][0]) == 1.0
    assert pool.endpoints[A].in_flight == 1
    await stream.aclose()  # type: ignore[attr-defined]
    assert client.stream.cancelled and pool.endpoints[A].in_flight == 0


async def test_a_client_unused_for_a_minute_is_closed_unless_a_call_is_in_flight() -> None:
    """Every address a model has is checked every few seconds (the readiness watcher closes idle clients
    after each round): one unused that long has left its DNS name."""
    pool = await ready_pool(A, B)
    clients = {A: Client(stream=[result(1.0), result(2.0)]), B: Client()}
    triton = triton_with(clients)
    stream = triton.stream(pool, "m", INPUTS, ["y"])
    await anext(stream)  # a generation in flight on A
    triton._used.update({A: 0.0, B: 0.0})  # long ago
    await triton.close_idle()
    assert clients[B].closed and not clients[A].closed and list(triton._clients) == [A]
    await stream.aclose()  # type: ignore[attr-defined]
    await triton.close_idle()
    assert clients[A].closed and not triton._clients
