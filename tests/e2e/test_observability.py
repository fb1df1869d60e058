"""Request ids, access logs and Prometheus metrics, end to end on the session stack."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import LocalStack, http_ok
from tests.support.ports import free_port, wait_until
from tests.support.streams import parse_events

CHAT = {"model": "ft-echo", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5}
EMBEDDING = "all-minilm-l6-v2"
RERANK = "minilm-rerank"


def new_id() -> str:
    return f"test-{uuid.uuid4()}"


def log_lines(stack: LocalStack, component: str, needle: str) -> list[str]:
    assert stack.log_dir is not None
    text = (stack.log_dir / f"{component}.log").read_text(errors="replace")
    return [line for line in text.splitlines() if needle in line]


def events(events_file: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in events_file.read_text().splitlines() if line]


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    text = httpx.get(url, timeout=5).text
    return {(sample.name, frozenset(sample.labels.items())): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels` (0 when none)."""
    wanted = set(labels.items())
    return sum(v for (n, have), v in samples.items() if n == name and wanted <= have)


def test_a_given_request_id_is_echoed_logged_and_reaches_triton(http: httpx.Client, stack: LocalStack,
                                                                 events_file: Path) -> None:
    rid = new_id()
    response = http.post("/v1/chat/completions", json=CHAT,
                         headers={"X-Request-ID": rid, "Authorization": "Bearer sk-not-for-logs"})
    assert response.status_code == 200
    assert response.headers["x-request-id"] == rid
    body = response.json()
    assert body["id"].startswith("chatcmpl-")  # the response id stays OpenAI's
    # ft-echo records the Triton request id it was given: the client's id and the choice index.
    wait_until(lambda: any(e.get("request_id") == f"{rid}-0" for e in events(events_file)), 10, "ft-echo's event")
    wait_until(lambda: log_lines(stack, "edge", f"[{rid}]"), 10, "the edge's access log line")
    (line,) = log_lines(stack, "edge", f"[{rid}]")
    usage = body["usage"]
    assert "tritongate.access" in line and "POST /v1/chat/completions 200 model=ft-echo" in line
    assert f"prompt_tokens={usage['prompt_tokens']} completion_tokens={usage['completion_tokens']}" in line
    assert not log_lines(stack, "edge", "sk-not-for-logs")


def test_an_id_is_made_up_when_missing_or_unsafe(http: httpx.Client) -> None:
    made = http.get("/v1/models").headers["x-request-id"]
    assert len(made) == 32 and int(made, 16) >= 0
    assert http.get("/v1/models").headers["x-request-id"] != made
    for unsafe in ("x" * 129, b"caf\xe9"):
        echoed = http.get("/v1/models", headers={"X-Request-ID": unsafe}).headers["x-request-id"]
        assert len(echoed) == 32 and echoed != unsafe


def test_errors_and_streams_carry_the_id_too(http: httpx.Client) -> None:
    for method, path, body, status in (("GET", "/nowhere", None, 404),
                                       ("POST", "/v1/chat/completions", {"model": "ft-echo"}, 400),
                                       ("POST", "/v1/embeddings", {"model": "no-such-model", "input": "a"}, 404)):
        rid = new_id()
        response = http.request(method, path, json=body, headers={"X-Request-ID": rid})
        assert (response.status_code, response.headers["x-request-id"]) == (status, rid)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    rid = new_id()
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True},
                     headers={"X-Request-ID": rid}) as response:
        assert response.headers["x-request-id"] == rid
        assert parse_events(response.read().decode())[-1].data == "[DONE]"


def test_a_service_failure_is_logged_by_the_service_under_the_id(http: httpx.Client, stack: LocalStack) -> None:
    rid = new_id()
    with http.stream("POST", "/v1/chat/completions", headers={"X-Request-ID": rid},
                     json={**CHAT, "model": "ft-echo-failing", "stream": True}) as response:
        response.read()
    wait_until(lambda: log_lines(stack, "llm", f"[{rid}]"), 10, "the llm service's log line")
    assert any("injected error" in line for line in log_lines(stack, "llm", f"[{rid}]"))


def test_metrics_after_embeddings_a_chat_stream_and_a_rerank(http: httpx.Client, stack: LocalStack) -> None:
    edge_url = f"{stack.edge_url}/metrics"
    services = {name: f"http://127.0.0.1:{port}/metrics" for name, port in stack.metrics_ports.items()}
    before = {"edge": scrape(edge_url), **{name: scrape(url) for name, url in services.items()}}

    embedded = http.post("/v1/embeddings", json={"model": EMBEDDING, "input": ["one", "two", "three"]}).json()
    with http.stream("POST", "/v1/chat/completions",
                     json={**CHAT, "stream": True, "stream_options": {"include_usage": True}}) as response:
        chat_usage = json.loads(parse_events(response.read().decode())[-2].data)["usage"]
    # A stream whose tokens arrive apart (the slow echo: 50 ms each), so that there are gaps to time; the
    # fast echo's few tokens may all arrive in one message of the service.
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "model": "ft-echo-slow", "stream": True}) as slow:
        slow.read()
    reranked = http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": ["a", "b"]}).json()

    after = {"edge": scrape(edge_url), **{name: scrape(url) for name, url in services.items()}}

    def grew(where: str, name: str, **labels: str) -> float:
        return value(after[where], name, **labels) - value(before[where], name, **labels)

    # Edge: requests by route, model and status; latency; time to first token; tokens in and out.
    for route, model in (("/v1/embeddings", EMBEDDING), ("/v1/chat/completions", "ft-echo"), ("/v1/rerank", RERANK)):
        assert grew("edge", "http_requests_total", route=route, model=model, status="200") == 1
        assert grew("edge", "http_request_duration_seconds_count", route=route, model=model) == 1
        assert grew("edge", "http_request_duration_seconds_sum", route=route, model=model) > 0
    assert grew("edge", "tritongate_time_to_first_token_seconds_count", model="ft-echo") == 1
    assert grew("edge", "tritongate_inter_token_latency_seconds_count", model="ft-echo-slow") >= 1
    tokens = {(model, kind): grew("edge", "tritongate_tokens_total", model=model, kind=kind)
              for model in ("ft-echo", EMBEDDING, RERANK) for kind in ("prompt", "completion")}
    assert tokens == {
        ("ft-echo", "prompt"): chat_usage["prompt_tokens"], ("ft-echo", "completion"): chat_usage["completion_tokens"],
        (EMBEDDING, "prompt"): embedded["usage"]["prompt_tokens"], (EMBEDDING, "completion"): 0,
        (RERANK, "prompt"): reranked["usage"]["prompt_tokens"], (RERANK, "completion"): 0}
    assert min(chat_usage["completion_tokens"], embedded["usage"]["prompt_tokens"]) > 0
    assert value(after["edge"], "http_requests_in_progress", method="POST") == 0
    assert grew("edge", "http_requests_total", route="/metrics", model="", status="200") == 1  # the first scrape

    # Services: RPCs by method and code, Triton call latency by model and outcome, rows per Triton call.
    assert grew("embed", "grpc_server_handled_total", grpc_method="Embed", grpc_code="OK") == 1
    assert grew("rerank", "grpc_server_handled_total", grpc_method="Rerank", grpc_code="OK") == 1
    assert grew("llm", "grpc_server_handled_total", grpc_method="Generate", grpc_code="OK") == 2
    for service, model in (("embed", EMBEDDING), ("rerank", RERANK), ("llm", "ft-echo")):
        assert grew(service, "tritongate_triton_request_duration_seconds_count", model=model, outcome="OK") >= 1
        assert grew(service, "tritongate_triton_request_duration_seconds_sum", model=model, outcome="OK") > 0
    assert grew("embed", "tritongate_batch_size_sum", model=EMBEDDING) == 3
    assert grew("rerank", "tritongate_batch_size_sum", model=RERANK) == 2


@pytest.mark.parametrize("component", ["edge", "llm"])
def test_log_lines_outside_requests_say_so(stack: LocalStack, component: str) -> None:
    assert log_lines(stack, component, " [-]: ")  # e.g. start-up lines: the format holds everywhere


def test_log_json_makes_every_edge_line_a_json_object(tmp_path: Path) -> None:
    """A real edge process with --log-json (no services needed for an unknown path)."""
    port = free_port()
    log = tmp_path / "edge.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "launcher.cli", "edge", "--log-json", "--port", str(port)],
                                   stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/health/live"), 20, "the edge", process)
        rid = new_id()
        assert httpx.get(f"http://127.0.0.1:{port}/nowhere", headers={"X-Request-ID": rid}).status_code == 404
        wait_until(lambda: rid in log.read_text(), 10, "the access log line")
    finally:
        process.terminate()
        process.wait(10)
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line parses
    access = next(line for line in lines if line["request_id"] == rid)
    assert {k: access[k] for k in ("logger", "level", "method", "path", "route", "status", "model")} == {
        "logger": "tritongate.access", "level": "INFO", "method": "GET", "path": "/nowhere", "route": "unmatched",
        "status": 404, "model": ""}
    assert access["duration_ms"] >= 0 and access["prompt_tokens"] is None
    assert any(line["logger"].startswith("uvicorn") for line in lines)
