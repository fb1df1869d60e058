"""Fault injection with the real processes, on a private stack (its own Triton on the test models and
the MiniLM models, its own services and edge) so that the session's stack is untouched:

- deadlines: 504 in OpenAI's shape (an SSE error event then [DONE] mid-stream), the Triton request
  cancelled;
- a service killed: its routes 503, the others keep working, /v1/models lists the rest;
- Triton stopped under load: 503s, no request hangs, health NOT_SERVING; Triton started again on the
  same ports: requests succeed again with no service restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.healthcheck import probe
from launcher.stack import LocalStack, grpc_serving, http_ok
from tests.support.load import Load
from tests.support.openai_schema import validate
from tests.support.ports import free_port, wait_until
from tests.support.stack import TESTS, stack_settings
from tests.support.stack import spawn as _spawn
from tests.support.streams import parse_events
from tritongate.registry import NAMES
from tritongate.settings import DEPLOY_DIR, default_cache_dir
from tritongate.triton_local import TritonLaunch, TritonProcess, start_triton

CHAT = "ft-echo"
SLOW = "ft-echo-slow"  # 50 ms per token
EMBED = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
HI = [{"role": "user", "content": "hi there"}]
LONG_TEXTS = ["a long sentence about nothing in particular " * 30] * 64  # ~16k tokens: far over 0.1 s


@dataclass
class Private:
    """The private stack; `triton` changes when the test restarts it."""

    stack: LocalStack
    triton: TritonProcess
    repository: Path
    events: Path
    config: Path
    logs: Path
    extra: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start_triton(self, http_port: int, grpc_port: int, metrics_port: int) -> TritonProcess:
        self.triton = start_triton(TritonLaunch(
            repositories=[self.repository], models_dir=self.stack.settings.models_dir, cache_dir=default_cache_dir(),
            http_port=http_port, grpc_port=grpc_port, metrics_port=metrics_port,
            log_path=self.logs / f"tritonserver-{time.monotonic_ns()}.log",
            extra_env={"TRITONGATE_TEST_EVENTS": str(self.events)}))
        self.triton.wait_ready(300)
        return self.triton

    def spawn(self, args: list[str], **env: str) -> subprocess.Popen[bytes]:
        process = _spawn(args, dict(os.environ, TRITONGATE_CONFIG_FILE=str(self.config), **env),
                         self.logs / f"{args[0]}-{len(self.extra)}.log")
        self.extra.append(process)
        return process

    def edge(self, embed: str | None = None, **env: str) -> str:
        """Another edge on the private services (`embed` replaces the embed service's address)."""
        port = free_port()
        address = self.stack.service_address
        process = self.spawn(["edge", "--port", str(port), f"--llm={address('llm')}",
                              f"--embed={embed or address('embed')}", f"--rerank={address('rerank')}"], **env)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/health"), 60, "the edge", process)
        return url

    def cancelled_events(self, offset: int) -> list[dict[str, Any]]:
        lines = self.events.read_text()[offset:].splitlines()
        return [event for event in map(json.loads, lines) if event["event"] == "cancelled"]


@pytest.fixture(scope="module")
def private(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Private]:
    root = tmp_path_factory.mktemp("faults")
    repository = root / "repository"  # the test model and the MiniLM models only: starts in seconds
    repository.mkdir()
    for model in (TESTS / "triton_models" / "ft-echo", DEPLOY_DIR / "triton" / EMBED, DEPLOY_DIR / "triton" / RERANK):
        (repository / model.name).symlink_to(model)
    events = root / "events.jsonl"
    events.touch()
    full = json.loads((TESTS / "model_config.json").read_text())
    config = {"model_infos": full["model_infos"],
              "llm": [e for e in full["llm"] if e["name"] in (CHAT, SLOW)],
              "embedding": [e for e in full["embedding"] if e["name"] == EMBED],
              "rerank": [e for e in full["rerank"] if e["name"] == RERANK]}
    settings = stack_settings(root / "model_config.json", models_dir=models_dir)
    faults = Private(LocalStack(settings, log_dir=root / "logs"), None, repository, events,  # type: ignore[arg-type]
                     settings.config_file, root / "logs")
    faults.logs.mkdir()
    try:
        triton = faults.start_triton(free_port(), free_port(), free_port())
        for section in ("llm", "embedding", "rerank"):
            for entry in config[section]:
                entry["url"] = triton.grpc_url
        settings.config_file.write_text(json.dumps(config))
        faults.stack.triton = triton
        faults.stack.start()
        yield faults
    finally:
        for process in faults.extra:
            if process.poll() is None:
                process.kill()
            process.wait()
        faults.stack.stop()
        if faults.triton is not None:
            faults.triton.stop()


def assert_error(response: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    validate(body, "ErrorResponse")
    if code is not None:
        assert body["error"]["code"] == code, body
    return body


def health_status(address: str) -> str:
    """SERVING, NOT_SERVING, or "unreachable: <code>"."""
    return probe(address, 1.0)[1]


def test_a_deadline_is_a_504_and_cancels_the_triton_request(private: Private) -> None:
    url = private.edge(TRITONGATE_REQUEST_TIMEOUT_S="1", TRITONGATE_UNARY_TIMEOUT_S="0.1")
    with httpx.Client(base_url=url, timeout=30) as http:
        offset = len(private.events.read_text())
        started = time.monotonic()
        whole = http.post("/v1/chat/completions", json={"model": SLOW, "messages": HI, "max_tokens": 100})
        assert time.monotonic() - started < 5  # the 5 s generation was cut at the deadline
        assert_error(whole, 504, "timeout")
        wait_until(lambda: len(private.cancelled_events(offset)) == 1, 5, "Triton to see the cancellation")

        offset = len(private.events.read_text())
        body = {"model": SLOW, "messages": HI, "max_tokens": 100, "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            events = parse_events(response.read().decode())
        assert [e.name for e in events][-2:] == ["error", None] and events[-1].data == "[DONE]"
        assert len(events) > 3  # some tokens came before the deadline
        error = json.loads(events[-2].data)
        validate(error, "ErrorResponse")
        assert error["error"]["code"] == "timeout" and error["error"]["type"] == "server_error"
        wait_until(lambda: len(private.cancelled_events(offset)) == 1, 5, "Triton to see the cancellation")

        assert_error(http.post("/v1/embeddings", json={"model": EMBED, "input": LONG_TEXTS}), 504, "timeout")
        assert_error(http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": LONG_TEXTS}),
                     504, "timeout")
    with httpx.Client(base_url=private.stack.edge_url, timeout=30) as http:  # the same services, no deadline hit
        assert http.post("/v1/embeddings", json={"model": EMBED, "input": LONG_TEXTS[:4]}).status_code == 200


def test_a_killed_service_503s_its_routes_and_the_others_keep_working(private: Private) -> None:
    port = free_port()
    embed = private.spawn(["embed", "--port", str(port)])
    wait_until(lambda: grpc_serving(f"127.0.0.1:{port}"), 120, "the embed service", embed)
    url = private.edge(embed=f"127.0.0.1:{port}")
    with httpx.Client(base_url=url, timeout=30) as http:
        assert http.post("/v1/embeddings", json={"model": EMBED, "input": "x"}).status_code == 200
        embed.kill()
        embed.wait()
        assert_error(http.post("/v1/embeddings", json={"model": EMBED, "input": "x"}), 503, "service_unavailable")
        chat = http.post("/v1/chat/completions", json={"model": CHAT, "messages": HI, "max_tokens": 2})
        assert chat.status_code == 200, chat.text
        rerank = http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": ["a", "b"]})
        assert rerank.status_code == 200, rerank.text

        def listed() -> set[str]:
            return {model["id"] for model in http.get("/v1/models").json()["data"]}

        wait_until(lambda: EMBED not in listed(), 15, "the model list to drop the embed service's models")
        assert listed() == {CHAT, SLOW, RERANK}
        # Once its models are no longer listed, the embed route still says the service is down (not 404),
        # and when to try again.
        down = http.post("/v1/embeddings", json={"model": EMBED, "input": "x"})
        assert_error(down, 503, "service_unavailable")
        assert down.headers["retry-after"] == "1"


def embed_and_chat(url: str) -> Load:
    """Embeddings and chat requests in a loop from two threads."""
    return Load(url, {"embed": ("/v1/embeddings", {"model": EMBED, "input": ["load", "more load"]}),
                      "chat": ("/v1/chat/completions", {"model": CHAT, "messages": HI, "max_tokens": 4})})


def test_triton_stopped_under_load_then_back_with_no_service_restart(private: Private) -> None:
    stack, triton = private.stack, private.triton
    pids = [process.pid for _, process in stack.children]
    with embed_and_chat(stack.edge_url) as load, httpx.Client(base_url=stack.edge_url, timeout=30) as http:
        wait_until(lambda: load.ok_since(0) == {"embed", "chat"}, 20, "requests to succeed")
        stopping = time.monotonic()
        triton.kill()
        stopped = time.monotonic()
        # The services under load notice at their next Triton call; the idle one at its next poll (5 s).
        wait_until(lambda: all(health_status(stack.service_address(name)) == "NOT_SERVING"
                               for name in ("llm", "embed")), 3, "health to say NOT_SERVING")
        wait_until(lambda: health_status(stack.service_address("rerank")) == "NOT_SERVING", 6,
                   "the idle service's health to say NOT_SERVING")
        time.sleep(1.0)  # requests keep coming while Triton is down
        stream = http.post("/v1/chat/completions", json={"model": CHAT, "messages": HI, "stream": True})
        assert_error(stream, 503, "service_unavailable")
        assert_error(http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": ["a"]}), 503)
        # Sent after Triton died (one in flight at that moment may still have been answered in full).
        down = [o for o in load.outcomes if o.started > stopped]
        assert {o.name for o in down} == {"embed", "chat"}
        for o in down:
            assert o.status == 503, o
            assert o.seconds < 5, o  # fails fast, no hang
            validate(json.loads(o.text), "ErrorResponse")
        during = load.since(stopping)
        assert all(o.status in (200, 503) for o in during), during

        private.start_triton(triton.http_port, triton.grpc_port, free_port())
        back = time.monotonic()
        wait_until(lambda: load.ok_since(back) == {"embed", "chat"}, 15, "requests to succeed again")
        wait_until(lambda: all(grpc_serving(stack.service_address(name)) for name in NAMES),
                   10, "health to say SERVING")
        assert http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": ["a"]}).status_code == 200
    assert [process.pid for _, process in stack.children] == pids
    assert all(process.poll() is None for _, process in stack.children)
