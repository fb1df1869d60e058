"""API keys end to end: edges with two keys (one from TRITONGATE_API_KEY, one from a key file) in front
of the session's real services. The route table is walked, so a route added later without a sample
request here fails the test instead of slipping through unprotected."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from edge.app import create_app
from edge.auth import OPEN_PATHS
from launcher.stack import LocalStack, http_ok
from tests.support.anthropic_schema import validate_error
from tests.support.openai_schema import validate
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn as _spawn
from tritongate.registry import NAMES
from tritongate.settings import Settings

KEY_FROM_ENV = "tg-env-key-4f9d0c2b7a"
KEY_FROM_FILE = "tg-file-key-81e3a6d5c0-much-longer-than-the-other"
KEYS = (KEY_FROM_ENV, KEY_FROM_FILE)
RERANK = {"model": "minilm-rerank", "query": "capital of France", "documents": ["Paris", "Berlin"]}

# (method, route template) → (path to call, JSON body). Every protected route needs one.
SAMPLES: dict[tuple[str, str], tuple[str, dict[str, Any] | None]] = {
    ("GET", "/v1/models"): ("/v1/models", None),
    ("GET", "/v1/models/{model_id}"): ("/v1/models/ft-echo", None),
    ("POST", "/v1/chat/completions"): ("/v1/chat/completions", {
        "model": "ft-echo", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("POST", "/v1/completions"): ("/v1/completions", {"model": "ft-echo", "prompt": "hi there", "max_tokens": 2}),
    ("POST", "/v1/embeddings"): ("/v1/embeddings", {"model": "all-minilm-l6-v2", "input": "hi"}),
    ("POST", "/v1/rerank"): ("/v1/rerank", RERANK),
    ("POST", "/v2/rerank"): ("/v2/rerank", RERANK),
    ("POST", "/rerank"): ("/rerank", RERANK),
    ("POST", "/v1/ranking"): ("/v1/ranking", {"model": "minilm-rerank", "query": {"text": "capital of France"},
                                              "passages": [{"text": "Paris"}]}),
    ("GET", "/info"): ("/info", None),
    ("POST", "/embed"): ("/embed", {"inputs": "hi"}),
    ("GET", "/metrics"): ("/metrics", None),
    ("POST", "/v1/responses"): ("/v1/responses", {"model": "ft-echo", "input": "hi", "max_output_tokens": 2}),
    # {stored} is a response this edge stored (see `stored_response`).
    ("GET", "/v1/responses/{response_id}"): ("/v1/responses/{stored}", None),
    ("POST", "/v1/chat/interactive"): ("/v1/chat/interactive", {
        "model": "ft-echo", "prompt": "hi", "request_output_len": 2}),
    ("POST", "/tokenize"): ("/tokenize", {"model": "ft-echo", "prompt": "hi"}),
    ("POST", "/detokenize"): ("/detokenize", {"model": "ft-echo", "tokens": [1, 2]}),
    ("POST", "/v1/messages"): ("/v1/messages", {"model": "ft-echo", "max_tokens": 2,
                                                "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/v1/messages/count_tokens"): ("/v1/messages/count_tokens", {
        "model": "ft-echo", "messages": [{"role": "user", "content": "hi"}]}),
    # The Batch API's: {file} and {batch} are made afresh by the key of each call (see `owned`).
    ("POST", "/v1/files"): ("/v1/files", None),  # multipart: BATCH_FILE
    ("GET", "/v1/files"): ("/v1/files", None),
    ("GET", "/v1/files/{file_id}"): ("/v1/files/{file}", None),
    ("GET", "/v1/files/{file_id}/content"): ("/v1/files/{file}/content", None),
    ("DELETE", "/v1/files/{file_id}"): ("/v1/files/{file}", None),
    ("POST", "/v1/batches"): ("/v1/batches", {"input_file_id": "{file}", "endpoint": "/v1/chat/completions",
                                              "completion_window": "24h"}),
    ("GET", "/v1/batches"): ("/v1/batches", None),
    ("GET", "/v1/batches/{batch_id}"): ("/v1/batches/{batch}", None),
    ("POST", "/v1/batches/{batch_id}/cancel"): ("/v1/batches/{batch}/cancel", None),
}
# A batch's one line, slow enough (5 s) that the batch is still running when it is cancelled.
BATCH_FILE = json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
                         "body": {"model": "ft-echo-slow", "max_tokens": 100,
                                  "messages": [{"role": "user", "content": "hi"}]}}).encode()


@dataclass
class Edge:
    url: str
    log: Path
    settings: Settings  # what the edge runs with, for create_app's route table
    process: subprocess.Popen[bytes]


def _start_edge(stack: LocalStack, tmp: Path, key_file: Path, metrics_require_key: bool) -> Edge:
    port = free_port()
    targets = [f"--{name}={stack.service_address(name)}" for name in NAMES]
    env = dict(os.environ, TRITONGATE_API_KEY=KEY_FROM_ENV, TRITONGATE_METRICS_REQUIRE_KEY=str(metrics_require_key))
    log = tmp / f"edge-{port}.log"
    # DEBUG logging everywhere: the keys must stay out of even the most verbose log.
    process = _spawn(["edge", "--port", str(port), *targets, "--api-key-file", str(key_file), "--verbose",
                      "--uvicorn-log-level", "debug"], env, log)
    settings = Settings(api_key=KEY_FROM_ENV, api_key_file=key_file,
                        metrics_require_key=metrics_require_key)
    return Edge(f"http://127.0.0.1:{port}", log, settings, process)


@pytest.fixture(scope="module")
def edges(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[bool, Edge]]:
    """By metrics_require_key: /metrics open (the default) and /metrics behind the key."""
    tmp = tmp_path_factory.mktemp("auth")
    key_file = tmp / "keys"
    key_file.write_text(f"# accepted keys\n\n{KEY_FROM_FILE}\n")
    started = {flag: _start_edge(stack, tmp, key_file, flag) for flag in (False, True)}
    try:
        for edge in started.values():
            wait_until(lambda edge=edge: http_ok(f"{edge.url}/health"), 60, "an edge with keys", edge.process)
        yield started
    finally:
        for edge in started.values():
            edge.process.terminate()
            edge.process.wait(30)


def routes(edge: Edge) -> set[tuple[str, str]]:
    """Every (method, path) the edge serves: its OpenAPI document and its routing table, which also
    holds the routes left out of the document."""
    document = httpx.get(f"{edge.url}/openapi.json", timeout=10).json()
    found = {(method.upper(), path) for path, operations in document["paths"].items() for method in operations}
    for entry in _route_table(create_app(edge.settings).routes):
        route = getattr(entry, "route", entry)
        found |= {(method, str(entry.path_format)) for method in getattr(route, "methods", None) or ()
                  if method != "HEAD"}  # HEAD mirrors GET
    return found


def _route_table(routes: list[Any]) -> list[Any]:
    """Every route, those of included routers too (recent FastAPI keeps those behind one entry each)."""
    try:
        from fastapi.routing import iter_route_contexts  # type: ignore[attr-defined,unused-ignore]
    except ImportError:  # older FastAPI: the table is already flat
        return routes
    return list(iter_route_contexts(routes))


def assert_unauthorized(response: httpx.Response) -> None:
    """A 401 in the error shape of the API the route speaks: Anthropic's under /v1/messages, TEI's on its own
    routes, else OpenAI's."""
    assert response.status_code == 401, (response.request.url, response.text)
    assert response.headers["www-authenticate"] == "Bearer"
    body = response.json()
    path = response.request.url.path
    if path.startswith("/v1/messages"):
        validate_error(body)
        assert body["error"]["type"] == "authentication_error"
    elif path in ("/info", "/embed"):
        assert set(body) == {"error", "error_type"} and body["error_type"] == "Unauthorized"
    else:
        validate(body, "ErrorResponse")
        assert body["error"]["type"] == "authentication_error" and body["error"]["code"] == "invalid_api_key"


def call(edge: Edge, method: str, path: str, body: dict[str, Any] | None, key: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    path, body = owned(edge, path, body, key)
    if (method, path) == ("POST", "/v1/files"):
        return httpx.post(f"{edge.url}{path}", files={"file": ("batch.jsonl", BATCH_FILE)}, data={"purpose": "batch"},
                          headers=headers, timeout=60)
    return httpx.request(method, f"{edge.url}{path}", json=body, headers=headers, timeout=60)


def owned(edge: Edge, path: str, body: dict[str, Any] | None, key: str | None
          ) -> tuple[str, dict[str, Any] | None]:
    """`path` and `body` with {file} and {batch} replaced by a file and a batch that `key` makes now (ids that
    do not exist when it cannot)."""
    if "{file}" not in path + json.dumps(body) and "{batch}" not in path:
        return path, body
    upload = call(edge, "POST", "/v1/files", None, key)
    file_id = upload.json()["id"] if upload.status_code == 200 else "file-none"
    batch_id = "batch_none"
    if "{batch}" in path:
        create = {"input_file_id": file_id, "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        created = call(edge, "POST", "/v1/batches", create, key)
        batch_id = created.json()["id"] if created.status_code == 200 else batch_id
    body = None if body is None else {name: file_id if value == "{file}" else value for name, value in body.items()}
    return path.replace("{file}", file_id).replace("{batch}", batch_id), body


@pytest.mark.parametrize("metrics_require_key", [False, True])
def test_every_route_but_the_open_ones_needs_one_of_the_keys(edges: dict[bool, Edge],
                                                              metrics_require_key: bool) -> None:
    edge = edges[metrics_require_key]
    table = routes(edge)
    assert ("POST", "/v1/chat/completions") in table and ("GET", "/metrics") in table  # the walk sees routes
    open_paths = OPEN_PATHS if metrics_require_key else OPEN_PATHS | {"/metrics"}
    protected = sorted(route for route in table if route[1] not in open_paths)
    missing = [route for route in protected if route not in SAMPLES]
    assert not missing, f"protected routes without a sample request in this test: {missing}"
    stored = call(edge, "POST", *SAMPLES[("POST", "/v1/responses")], KEYS[0]).json()["id"]
    for method, template in protected:
        path, body = SAMPLES[(method, template)]
        path = path.replace("{stored}", stored)
        assert_unauthorized(call(edge, method, path, body, None))
        assert_unauthorized(call(edge, method, path, body, "wrong-key"))
        assert_unauthorized(call(edge, method, path, body, KEY_FROM_ENV[:-1]))
        for key in KEYS:
            response = call(edge, method, path, body, key)
            assert response.status_code == 200, (method, path, response.text)


def test_health_and_the_docs_stay_open(edges: dict[bool, Edge]) -> None:
    for edge in edges.values():
        assert httpx.get(f"{edge.url}/health", timeout=10).json()["status"] == "ok"
        assert httpx.get(f"{edge.url}/openapi.json", timeout=10).status_code == 200
        assert httpx.get(f"{edge.url}/docs", timeout=10).status_code == 200
        for path in ("/playground", "/playground/playground.js", "/health/live", "/v1/health/ready"):
            assert httpx.get(f"{edge.url}{path}", timeout=10).status_code == 200, path  # the page asks for the key
    assert httpx.get(f"{edges[False].url}/metrics", timeout=10).status_code == 200
    assert_unauthorized(httpx.get(f"{edges[True].url}/metrics", timeout=10))


def test_unknown_paths_answer_401_before_404(edges: dict[bool, Edge]) -> None:
    edge = edges[False]
    assert_unauthorized(httpx.get(f"{edge.url}/v1/no-such-route", timeout=10))
    assert_unauthorized(httpx.post(f"{edge.url}/v1/assistants", json={}, timeout=10))
    assert httpx.get(f"{edge.url}/v1/no-such-route", headers={"Authorization": f"Bearer {KEY_FROM_FILE}"},
                     timeout=10).status_code == 404


def test_the_openai_sdk_raises_authentication_error_and_works_with_a_key(edges: dict[bool, Edge]) -> None:
    edge = edges[False]
    with pytest.raises(openai.AuthenticationError) as raised:
        openai.OpenAI(base_url=f"{edge.url}/v1", api_key="sk-wrong", max_retries=0).models.list()
    assert "sk-wrong" not in str(raised.value)
    client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=KEY_FROM_FILE, max_retries=0, timeout=60)
    completion = client.completions.create(model="ft-echo", prompt="hi there", max_tokens=2)
    assert completion.choices[0].finish_reason == "length"


def test_the_keys_never_reach_the_log(edges: dict[bool, Edge]) -> None:
    for edge in edges.values():
        call(edge, "POST", "/v1/embeddings", SAMPLES[("POST", "/v1/embeddings")][1], KEY_FROM_ENV)
        call(edge, "GET", "/v1/models", None, "wrong-key")
        text = edge.log.read_text(errors="replace")
        assert "GET /v1/models" in text  # the access log is there: the check below looks at real output
        for secret in KEYS:
            assert secret not in text


def test_the_anthropic_sdk_sends_its_key_as_x_api_key(edges: dict[bool, Edge]) -> None:
    import anthropic

    edge = edges[False]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=edge.url, api_key="sk-wrong", max_retries=0).messages.create(
            model="ft-echo", max_tokens=2, messages=[{"role": "user", "content": "hi"}])
    message = anthropic.Anthropic(base_url=edge.url, api_key=KEY_FROM_FILE, max_retries=0, timeout=60).messages.create(
        model="ft-echo", max_tokens=2, messages=[{"role": "user", "content": "hi there"}])
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 2
