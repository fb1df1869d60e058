"""Several processes per component, as `tritongate up --workers N` starts them: edge workers sharing one
port and replicas of a service behind the edge's round-robin channel. Requests are served by all of
them, a bad request in a burst fails alone, and /metrics counts every worker's requests."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from launcher.stack import LocalStack
from launcher.workers import REPLICA_PORT_STEP
from tests.support.metrics import total
from tests.support.ports import free_port
from tests.support.stack import stack_settings
from tritongate.triton_local import TritonProcess

MODEL = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def workers(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalStack]:
    with LocalStack(stack_settings(model_config_file), triton=triton, log_dir=tmp_path_factory.mktemp("logs"),
                    metrics_ports={"embed": free_port()}, processes={"edge": 2, "embed": 2}) as local:
        yield local


def _embed(http: httpx.Client, text: str) -> httpx.Response:
    return http.post("/v1/embeddings", json={"model": MODEL, "input": text})


def test_edge_workers_and_replicas_serve_a_burst_and_metrics_count_every_worker(workers: LocalStack) -> None:
    labels = [label for label, _ in workers.children]
    assert {"edge-1", "edge-2", "embed-1", "embed-2"} <= set(labels)
    texts = [f"sentence number {i}" for i in range(48)] + [""]  # one bad input among them
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        # A client per thread: separate connections, which the kernel spreads over the edge workers.
        def send(text: str) -> httpx.Response:
            with httpx.Client(base_url=workers.edge_url, timeout=60) as http:
                return _embed(http, text)

        responses = list(pool.map(send, texts))
    assert [r.status_code for r in responses[:-1]] == [200] * 48
    assert responses[-1].status_code == 400 and responses[-1].json()["error"]["param"] == "input"
    with httpx.Client(base_url=workers.edge_url, timeout=10) as http:
        metrics = http.get("/metrics").text
    # Whichever worker answers the scrape counts both workers' requests.
    assert total(metrics, "http_requests_total", model=MODEL, route="/v1/embeddings", status="200") == 48
    assert total(metrics, "http_requests_total", route="/v1/embeddings", status="400") == 1


def test_the_edge_balances_over_the_replicas(workers: LocalStack) -> None:
    with httpx.Client(base_url=workers.edge_url, timeout=60) as http:
        for i in range(8):
            assert _embed(http, f"one more sentence {i}").status_code == 200
    base = workers.metrics_ports["embed"]
    for port in (base, base + REPLICA_PORT_STEP):  # each replica's own metrics
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        assert total(metrics, "grpc_server_handled_total", grpc_method="Embed", grpc_code="OK") >= 2
