"""State that outlives a request, shared by every edge process: stored Responses (`previous_response_id`,
GET /v1/responses/{id}) and LMDeploy's interactive sessions, on a `tritongate up`-shaped stack with two
edge workers sharing a port (every request on a new connection, which the kernel spreads over them) and a
second edge replica on a port of its own; once with the default store (a SQLite file) and once with a
real Redis server. Then a Redis that goes away under an edge of its own (503 naming the store), and state
URLs an edge refuses at start."""

from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.stack import LocalStack, http_ok
from tests.support.ports import free_port, wait_until
from tests.support.redis_server import RedisServer
from tests.support.stack import private_state_url, spawn, stack_settings
from tritongate.registry import SERVICES

ECHO = "ft-echo"
SLOW = "ft-echo-slower"  # 0.5 s a token: its answers take seconds
ROUND_TRIPS = 100


@dataclass
class Edges:
    """Two edge workers on one port and a replica on its own port, all on one store."""

    stack: LocalStack
    replica_url: str

    @property
    def worker_logs(self) -> list[Path]:
        assert self.stack.log_dir is not None
        return [self.stack.log_dir / f"edge-{i}.log" for i in (1, 2)]


def llm_only_config(model_config_file: Path, directory: Path) -> Path:
    """The test configuration with only an echo LLM and a slow variant (one service to start), with room
    for 20 turns."""
    config = json.loads(model_config_file.read_text())
    (echo,) = [entry for entry in config["llm"] if entry["name"] == ECHO]
    slow = dict(echo, name=SLOW, triton_model=ECHO, triton_inputs={"delay_ms": 500})
    small = {"model_infos": [{"name": name, "max_len": 2048} for name in (ECHO, SLOW)], "llm": [echo, slow]}
    path = directory / "model_config.json"
    path.write_text(json.dumps(small))
    return path


def spawn_edge(stack: LocalStack, env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    targets = [f"--{service.name}={stack.service_address(service)}" for service in SERVICES]
    process = spawn(["edge", "--port", str(port), *targets], env, log)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/health"), 60, "the edge", process)
    return process, url


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def edges(request: pytest.FixtureRequest, triton: Any, model_config_file: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edges]:
    directory = tmp_path_factory.mktemp(f"shared-{request.param}")
    state_url = private_state_url()
    if request.param == "redis":
        state_url = request.getfixturevalue("redis_server").url
    settings = stack_settings(llm_only_config(model_config_file, directory), state_url=state_url)
    with LocalStack(settings, triton=triton, log_dir=directory / "logs", processes={"edge": 2}) as stack:
        replica, url = spawn_edge(stack, dict(os.environ, TRITONGATE_STATE_URL=state_url), directory / "replica.log")
        try:
            yield Edges(stack, url)
        finally:
            replica.terminate()
            replica.wait(30)


def fresh(url: str, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
    """One request on a connection of its own."""
    with httpx.Client(base_url=url, timeout=60) as http:
        return http.request(method, path, json=body)


def round_trip(edges: Edges, i: int) -> str | None:
    """store, GET and a follow-up, each on a new connection (the last on the other replica); what went
    wrong, or None."""
    url = edges.stack.edge_url
    first = fresh(url, "POST", "/v1/responses", {"model": ECHO, "input": f"question {i}", "max_output_tokens": 3})
    if first.status_code != 200:
        return f"create: {first.status_code} {first.text}"
    stored = fresh(url, "GET", f"/v1/responses/{first.json()['id']}")
    if stored.status_code != 200 or stored.json() != first.json():
        return f"GET: {stored.status_code} {stored.text}"
    follow = fresh(edges.replica_url if i % 2 else url, "POST", "/v1/responses",
                   {"model": ECHO, "input": "and then?", "max_output_tokens": 3,
                    "previous_response_id": first.json()["id"]})
    if follow.status_code != 200:
        return f"follow-up: {follow.status_code} {follow.text}"
    # The follow-up's prompt holds the first exchange: more input than a fresh request's.
    if follow.json()["usage"]["input_tokens"] <= first.json()["usage"]["input_tokens"]:
        return f"follow-up without its history: {follow.json()['usage']}"
    return None


def test_every_round_trip_finds_its_stored_response_on_any_edge_process(edges: Edges) -> None:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        failures = [f for f in pool.map(lambda i: round_trip(edges, i), range(ROUND_TRIPS)) if f]
    assert failures == []
    # Both workers answered: each logged some of the requests.
    assert all(log.read_text().count("/v1/responses") > 0 for log in edges.worker_logs)


def interactive(url: str, session: int, prompt: str, **fields: Any) -> dict[str, Any]:
    body = {"model": ECHO, "prompt": prompt, "session_id": session, "interactive_mode": True,
            "request_output_len": 2, **fields}
    response = fresh(url, "POST", "/v1/chat/interactive", body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_interactive_turns_over_alternating_connections_keep_the_whole_history(edges: Edges) -> None:
    session = 7_000 + uuid.uuid4().int % 1_000_000
    urls = [edges.stack.edge_url, edges.replica_url]
    history = 0
    for turn in range(20):
        answer = interactive(urls[turn % 2], session, f"turn {turn}")
        assert answer["history_tokens"] == history, f"turn {turn} saw another history"
        history += answer["input_tokens"] + answer["tokens"]
    ended = interactive(edges.replica_url, session, "", interactive_mode=False, request_output_len=0)
    assert ended["history_tokens"] == history


def test_concurrent_turns_on_one_session_lose_none(edges: Edges) -> None:
    session = 9_000_000 + uuid.uuid4().int % 1_000_000
    urls = [edges.stack.edge_url, edges.replica_url]
    opening = interactive(urls[0], session, "start")  # the session exists before the race
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: interactive(urls[i % 2], session, f"at once {i}"), range(8)))
    # Each turn adds what it brought (its new input and its answer) to the session: a lost turn would be
    # missing from the total.
    ended = interactive(urls[1], session, "", interactive_mode=False, request_output_len=0)
    brought = [answer["input_tokens"] + answer["tokens"] for answer in [opening, *answers]]
    assert ended["history_tokens"] == sum(brought), (ended, answers)


def test_a_cancel_sent_to_another_edge_process_stops_the_turn(edges: Edges) -> None:
    session = 20_000_000 + uuid.uuid4().int % 1_000_000
    answers: list[httpx.Response] = []
    body = {"model": SLOW, "prompt": "tick tock", "session_id": session, "interactive_mode": True,
            "request_output_len": 200}
    thread = threading.Thread(target=lambda: answers.append(fresh(edges.stack.edge_url, "POST",
                                                                  "/v1/chat/interactive", body)))
    thread.start()
    time.sleep(1.0)
    cancelled = fresh(edges.replica_url, "POST", "/v1/chat/interactive", {"prompt": "", "session_id": session,
                                                                          "cancel": True})
    assert cancelled.status_code == 200
    thread.join(60)
    assert not thread.is_alive() and answers[0].status_code == 200, answers[0].text
    assert answers[0].json()["text"] == "" and answers[0].json()["finish_reason"] == "stop"
    # The cancelled turn added nothing.
    assert interactive(edges.replica_url, session, "hi", model=SLOW, request_output_len=1)["history_tokens"] == 0


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def test_a_redis_that_goes_away_is_a_503_naming_the_store_until_it_is_back(
        stack: LocalStack, own_redis: RedisServer, tmp_path: Path) -> None:
    edge, url = spawn_edge(stack, dict(os.environ, TRITONGATE_STATE_URL=own_redis.url), tmp_path / "edge.log")
    try:
        created = fresh(url, "POST", "/v1/responses", {"model": ECHO, "input": "hi", "max_output_tokens": 2})
        assert created.status_code == 200
        own_redis.stop()
        for method, path, body in [("POST", "/v1/responses", {"model": ECHO, "input": "hi", "max_output_tokens": 2}),
                                   ("GET", f"/v1/responses/{created.json()['id']}", None),
                                   ("POST", "/v1/chat/interactive", {"model": ECHO, "prompt": "hi", "session_id": 5,
                                                                     "interactive_mode": True})]:
            refused = fresh(url, method, path, body)
            assert refused.status_code == 503, refused.text
            error = refused.json()["error"]
            assert error["code"] == "state_store_unavailable" and own_redis.url in error["message"]
            assert refused.headers["retry-after"] == "1"
        # What needs no store is served as before.
        chat = fresh(url, "POST", "/v1/chat/completions", {"model": ECHO, "max_tokens": 2,
                                                           "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200, chat.text
        own_redis.start()  # back on the same port, empty (no persistence)
        again = fresh(url, "POST", "/v1/responses", {"model": ECHO, "input": "hi", "max_output_tokens": 2})
        assert again.status_code == 200
        assert fresh(url, "GET", f"/v1/responses/{again.json()['id']}").status_code == 200
    finally:
        edge.terminate()
        edge.wait(30)
    assert "Traceback" not in (tmp_path / "edge.log").read_text()


@pytest.mark.parametrize("command", ["edge", "up"])  # `up` checks before it starts Triton and the services
@pytest.mark.parametrize(("state_url", "expected"), [
    ("postgres://db/state", "names no store"),
    ("redis://valkey:port/0", "does not parse"),
    ("redis://:secret@127.0.0.1:{port}/0", "is unavailable"),
])
def test_an_edge_refuses_to_start_on_a_store_it_cannot_use(command: str, state_url: str, expected: str) -> None:
    env = dict(os.environ, TRITONGATE_STATE_URL=state_url.format(port=free_port()))
    done = subprocess.run([sys.executable, "-m", "launcher.cli", command, "--port", str(free_port())], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0] and lines[0].startswith(f"tritongate {command}: error:"), \
        done.stderr
    assert "secret" not in done.stderr and "Traceback" not in done.stderr
