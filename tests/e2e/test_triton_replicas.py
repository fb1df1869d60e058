"""One model on two real Tritons (services/common/triton_pool.py), behind the real embed and llm services and
the edge: both Tritons take calls, a slow one takes fewer, a Triton killed under load costs no embedding
request (its calls are tried again on the other) and ends the generation it was streaming with a clean
error event, and a Triton started again on the same ports takes calls again. An address in the list where
nothing listens is named in a warning, and the model is served by the others.

Each Triton serves `embed-echo` and `ft-echo`; `embed-uneven` is embed-echo on Triton A and
embed-echo-slow (100 ms per execution) on Triton B. Each Triton's own statistics say how many requests
it answered."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.common import BENCH_MODELS
from launcher.stack import LocalStack
from tests.support.backends import echo_variants
from tests.support.load import Load
from tests.support.openai_schema import validate
from tests.support.ports import free_port, wait_until
from tests.support.stack import TESTS, metrics_ports, stack_settings
from tests.support.streams import Event, parse_events
from tritongate.settings import default_cache_dir
from tritongate.triton_local import TritonLaunch, TritonProcess, start_triton

EMBED = "embed-echo"
UNEVEN = "embed-uneven"
SLOW_CHAT = "ft-echo-slow"  # ft-echo, 50 ms per token (tests/support/backends.py)
LOAD_S = 30  # embeddings load around a Triton's death and return
MODELS = {"a": {EMBED: BENCH_MODELS / "embed-echo", UNEVEN: BENCH_MODELS / "embed-echo",
                "ft-echo": TESTS / "triton_models" / "ft-echo"},
          "b": {EMBED: BENCH_MODELS / "embed-echo", UNEVEN: BENCH_MODELS / "embed-echo-slow",
                "ft-echo": TESTS / "triton_models" / "ft-echo"}}


@dataclass
class Replicas:
    """Tritons `a` and `b` and the stack in front of them; `tritons` changes when a test restarts one."""

    root: Path
    models_dir: Path
    nowhere: str  # an address in embed-echo's list where nothing listens
    tritons: dict[str, TritonProcess] = field(default_factory=dict)
    stack: LocalStack | None = None

    def start_triton(self, name: str, ports: tuple[int, int, int]) -> TritonProcess:
        """Triton `name` on (http, grpc, metrics) ports; waited for by `wait_ready`."""
        repository = self.root / f"repository-{name}"
        if not repository.exists():
            repository.mkdir()
            for model, folder in MODELS[name].items():
                (repository / model).symlink_to(folder)
        http, grpc, metrics = ports
        self.tritons[name] = start_triton(TritonLaunch(
            repositories=[repository], models_dir=self.models_dir, cache_dir=default_cache_dir(),
            http_port=http, grpc_port=grpc, metrics_port=metrics,
            log_path=self.root / f"tritonserver-{name}-{time.monotonic_ns()}.log"))
        return self.tritons[name]

    def served(self, name: str, model: str) -> int:
        """Requests Triton `name` has answered for `model` since it started (its statistics)."""
        url = f"http://127.0.0.1:{self.tritons[name].http_port}/v2/models/{model}/stats"
        stats = httpx.get(url, timeout=10).json()["model_stats"]
        return sum(int(s["inference_stats"]["success"]["count"]) for s in stats)

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.tritons[name].grpc_port}"


@pytest.fixture(scope="module")
def replicas(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    root = tmp_path_factory.mktemp("replicas")
    replicas = Replicas(root, models_dir, nowhere=f"127.0.0.1:{free_port()}")
    try:
        for name in ("a", "b"):
            replicas.start_triton(name, (free_port(), free_port(), free_port()))
        for triton in replicas.tritons.values():
            triton.wait_ready(300)
        a, b = replicas.address("a"), replicas.address("b")
        encoder = {"path": str(models_dir / "all-minilm-l6-v2"), "max_tokens": 64, "output_name": "sentence_embedding"}
        full = json.loads((TESTS / "model_config.json").read_text())
        chat = next(entry for entry in full["llm"] if entry["name"] == "ft-echo")
        slow_chat = next(variant for variant in echo_variants(chat) if variant["name"] == SLOW_CHAT)
        config = {
            # Each way of writing several addresses: a string with commas, a JSON list, a DNS name.
            "embedding": [dict(encoder, name=EMBED, url=f"{a},{b},{replicas.nowhere}"),
                          dict(encoder, name=UNEVEN, url=a,
                               grpc_url=[f"dns:///localhost:{replicas.tritons['a'].grpc_port}", b])],
            "llm": [dict(slow_chat, url=a, grpc_url=[a, b])],
            "model_infos": [{"name": SLOW_CHAT, "max_len": 256}],
        }
        (root / "model_config.json").write_text(json.dumps(config))
        settings = stack_settings(root / "model_config.json", models_dir=models_dir)
        # The least-loaded rule for generations too: the two streams of one chat below go one to each Triton
        # (prefix-aware routing, which would keep them together, has tests/e2e/test_prefix_routing.py).
        replicas.stack = LocalStack(settings, triton=replicas.tritons["a"], log_dir=root / "logs",
                                    metrics_ports=metrics_ports(),
                                    extra_env={"TRITONGATE_TRITON_ROUTING": "least_loaded"})
        replicas.stack.start()
        yield replicas
    finally:
        if replicas.stack is not None:
            replicas.stack.stop()
        for triton in replicas.tritons.values():
            triton.stop()


def embeddings(url: str, model: str, threads: int = 4) -> Load:
    """Embedding requests through the edge from `threads` threads, one right after another."""
    return Load(url, {"embed": ("/v1/embeddings", lambda worker, i: {"model": model, "input": f"text {worker} {i}"})},
                threads=threads, pause_s=0)


def service_samples(replicas: Replicas, service: str, metric: str) -> dict[str, float]:
    """A service's samples of `metric`, by endpoint."""
    assert replicas.stack is not None
    port = replicas.stack.metrics_ports[service]
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {s.labels["endpoint"]: s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == metric}


def test_both_tritons_take_calls_and_an_address_where_nothing_listens_is_named(replicas: Replicas) -> None:
    assert replicas.stack is not None
    before = {name: replicas.served(name, EMBED) for name in ("a", "b")}
    with embeddings(replicas.stack.edge_url, EMBED) as load:
        wait_until(lambda: len(load.outcomes) >= 400, 120, "400 embeddings")
    assert load.failed() == []
    served = {name: replicas.served(name, EMBED) - before[name] for name in ("a", "b")}
    assert min(served.values()) > 0.25 * sum(served.values()), served  # two equal Tritons share the load
    calls = service_samples(replicas, "embed", "tritongate_triton_endpoint_calls_total")
    assert calls[replicas.address("a")] > 0 and calls[replicas.address("b")] > 0
    assert service_samples(replicas, "embed", "tritongate_triton_endpoint_ready")[replicas.nowhere] == 0
    log = (replicas.root / "logs" / "embed.log").read_text()
    assert f"Triton endpoint {replicas.nowhere} is not ready: Triton did not answer" in log
    assert "Traceback" not in log


def test_a_slow_triton_takes_fewer_calls(replicas: Replicas) -> None:
    assert replicas.stack is not None
    before = {name: replicas.served(name, UNEVEN) for name in ("a", "b")}
    with embeddings(replicas.stack.edge_url, UNEVEN, threads=8) as load:
        wait_until(lambda: len(load.outcomes) >= 400, 120, "400 embeddings")
    assert load.failed() == []
    served = {name: replicas.served(name, UNEVEN) - before[name] for name in ("a", "b")}
    assert served["b"] > 0 and served["b"] * 3 < served["a"], served  # round robin would split them evenly


class Stream:
    """A streamed chat completion in a thread of its own; its SSE events as they arrive."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.text = ""
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        body = {"model": SLOW_CHAT, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 100,
                "stream": True}
        with httpx.Client(base_url=self.url, timeout=120) as http, \
                http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            for chunk in response.iter_text():
                self.text += chunk

    def events(self) -> list[Event]:
        return parse_events(self.text)


def test_a_triton_killed_under_load_costs_no_embedding_and_takes_calls_again_when_back(replicas: Replicas) -> None:
    assert replicas.stack is not None
    b = replicas.tritons["b"]
    started = time.monotonic()
    with embeddings(replicas.stack.edge_url, EMBED) as load:
        before = replicas.served("b", EMBED)
        wait_until(lambda: replicas.served("b", EMBED) > before, 60, "Triton B to answer embeddings")
        streams = [Stream(replicas.stack.edge_url) for _ in range(2)]  # one on each Triton: fewest in flight
        wait_until(lambda: all(len(stream.events()) >= 3 for stream in streams), 60, "both streams to start")
        b.kill()
        killed = len(load.outcomes)
        for stream in streams:
            stream.thread.join(120)
        wait_until(lambda: len(load.outcomes) > killed + 200, 120, "embeddings after the kill")
        time.sleep(5)  # and more, for as long as Triton B is away
        replicas.start_triton("b", (b.http_port, b.grpc_port, free_port())).wait_ready(300)
        wait_until(lambda: replicas.served("b", EMBED) > 0, 120, "the restarted Triton to answer embeddings")
        wait_until(lambda: time.monotonic() - started > LOAD_S, LOAD_S, f"{LOAD_S} s of load")
    assert load.failed() == [], load.failed()[:5]

    [failed] = [stream.events() for stream in streams if any(event.name == "error" for event in stream.events())]
    [finished] = [stream.events() for stream in streams if not any(event.name for event in stream.events())]
    assert finished[-1].data == "[DONE]"
    assert json.loads(finished[-2].data)["choices"][0]["finish_reason"] in ("stop", "length")
    assert [event.name for event in failed][-2:] == ["error", None] and failed[-1].data == "[DONE]"
    error: dict[str, Any] = json.loads(failed[-2].data)
    validate(error, "ErrorResponse")
    assert error["error"]["type"] == "server_error", error
    assert len(failed) > 3  # tokens had gone out from Triton B before it died
