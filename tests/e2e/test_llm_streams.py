"""How the edge carries generations to the llm service (TRITONGATE_LLM_STREAMS): on a few GenerateMany streams
by default, spread over the service's replicas (more replicas than streams, too); or with a Generate call
each (0). Either way the client gets the same answers, and a client that goes away cancels its generation."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from edge.many import STREAM_STARTS
from launcher.stack import LocalStack
from launcher.workers import REPLICA_PORT_STEP
from tests.support.metrics import total
from tests.support.ports import free_port, wait_until
from tests.support.stack import stack_settings
from tests.support.streams import stream_chunks
from tritongate.triton_local import TritonProcess

PROMPT = "one two three four five"


def _stack(triton: TritonProcess, model_config_file: Path, logs: Path, replicas: int, **env: str) -> LocalStack:
    return LocalStack(stack_settings(model_config_file), triton=triton, log_dir=logs, extra_env=env,
                      metrics_ports={"llm": free_port()}, processes={"edge": 1, "llm": replicas})


@pytest.fixture(scope="module")
def replicas(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[LocalStack]:
    # One stream for two replicas: each stream is replaced after STREAM_STARTS generations, on the next replica.
    with _stack(triton, model_config_file, tmp_path_factory.mktemp("logs"), 2, TRITONGATE_LLM_STREAMS="1") as local:
        yield local


@pytest.fixture(scope="module")
def calls(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LocalStack]:
    with _stack(triton, model_config_file, tmp_path_factory.mktemp("logs"), 1, TRITONGATE_LLM_STREAMS="0") as local:
        yield local


def metrics(stack: LocalStack, replica: int = 0) -> str:
    return httpx.get(f"http://127.0.0.1:{stack.metrics_ports['llm'] + replica * REPLICA_PORT_STEP}/metrics",
                     timeout=10).text


def chat(stack: LocalStack, max_tokens: int = 10, model: str = "ft-echo") -> str:
    with httpx.Client(base_url=stack.edge_url, timeout=60) as http:
        chunks = stream_chunks(http, "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": max_tokens,
            "stream": True})
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_streams_carry_the_generations_over_every_replica(replicas: LocalStack, calls: LocalStack) -> None:
    expected = chat(calls)  # a Generate call of its own
    assert expected  # ten tokens of the echoed chat prompt
    assert chat(replicas) == expected  # the first stream, on one replica; the channel connects to both
    count = 1 + STREAM_STARTS  # one more than the first stream takes
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: chat(replicas), range(count - 1)))
    assert answers == [expected] * (count - 1)
    per_replica = [total(metrics(replicas, i), "grpc_server_handled_total", grpc_method="Generate", grpc_code="OK")
                   for i in (0, 1)]
    assert sum(per_replica) == count and min(per_replica) >= 1, per_replica  # the edge's one stream, then the next
    streams = [total(metrics(replicas, i), "grpc_server_started_total", grpc_method="GenerateMany") for i in (0, 1)]
    assert min(streams) >= 1 and sum(streams) >= 2, streams
    assert total(metrics(calls), "grpc_server_started_total", grpc_method="GenerateMany") == 0
    assert total(metrics(calls), "grpc_server_handled_total", grpc_method="Generate", grpc_code="OK") == 1


@pytest.mark.parametrize("path", ["replicas", "calls"])
def test_a_client_that_goes_away_cancels_its_generation(path: str, request: pytest.FixtureRequest) -> None:
    stack: LocalStack = request.getfixturevalue(path)

    def cancelled() -> float:
        return sum(total(metrics(stack, i), "grpc_server_handled_total", grpc_method="Generate",
                          grpc_code="CANCELLED") for i in range(stack.processes["llm"]))

    before = cancelled()
    with httpx.Client(base_url=stack.edge_url, timeout=60) as http, http.stream("POST", "/v1/chat/completions", json={
            "model": "ft-echo-slow", "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 200,
            "stream": True}) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        assert any(line.startswith("data: ") for line in lines)  # the first chunk came; then hang up
    wait_until(lambda: cancelled() == before + 1, 10, "the service's side of the generation cancelled")
