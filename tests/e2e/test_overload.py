"""Overload end to end: an llm service bounded to 4 requests in flight (its own process and edge, on the
session's Triton) under a burst of 10x that many. The requests beyond the bound are refused at once
with 429, Retry-After and OpenAI's error body; the admitted ones complete as usual; the service's
memory stays bounded; health probes keep answering; the next request is served."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.stack import LocalStack, grpc_serving
from tests.support.openai_schema import validate
from tests.support.stack import stack_settings
from tritongate.triton_local import TritonProcess

MAX_IN_FLIGHT = 4
BURST = 10 * MAX_IN_FLIGHT
SLOW = "ft-echo-slow"  # 50 ms per token
ECHO = "ft-echo"
LIMITS = {"max_n": 2, "max_choices": 3, "max_completion_tokens": 20}
MAX_TOKENS = 10
RSS_GROWTH_LIMIT = 64 * 1024 * 1024


@pytest.fixture(scope="module")
def bounded(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[LocalStack]:
    """Only the llm service (ft-echo models) and an edge, with max_in_flight=4; ft-echo has tighter
    per-model limits than the defaults."""
    config = json.loads(model_config_file.read_text())
    config = {"model_infos": config["model_infos"],
              "llm": [entry for entry in config["llm"] if entry["name"] in (ECHO, SLOW)]}
    config["llm"][0].update(LIMITS)
    path = tmp_path_factory.mktemp("overload") / "model_config.json"
    path.write_text(json.dumps(config))
    with LocalStack(stack_settings(path), triton=triton, log_dir=path.parent / "logs",
                    extra_env={"TRITONGATE_MAX_IN_FLIGHT": str(MAX_IN_FLIGHT)}) as local:
        yield local


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class PeakRss:
    """Samples a process's resident memory in the background; `peak` is the largest seen."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self.stop = pid, rss_bytes(pid), threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes(self.pid))

    def __enter__(self) -> PeakRss:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join()


async def send(client: httpx.AsyncClient, index: int) -> tuple[int, dict[str, str], Any, float]:
    """One request of the burst, streamed every other time: (status, headers, body or text, seconds)."""
    stream = index % 2 == 1
    body = {"model": SLOW, "prompt": "tick tock", "max_tokens": MAX_TOKENS, "stream": stream}
    start = time.monotonic()
    async with client.stream("POST", "/v1/completions", json=body) as response:
        raw = (await response.aread()).decode()
    elapsed = time.monotonic() - start
    if response.status_code == 200 and stream:
        return 200, dict(response.headers), raw, elapsed
    return response.status_code, dict(response.headers), json.loads(raw), elapsed


def streamed_text(raw: str) -> str:
    data = [line[len("data: "):] for line in raw.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]", raw
    chunks = [json.loads(item) for item in data[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    return "".join(chunk["choices"][0]["text"] for chunk in chunks)


async def burst(url: str) -> list[tuple[int, dict[str, str], Any, float]]:
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=BURST)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as client:
        return await asyncio.gather(*(send(client, i) for i in range(BURST)))


def test_a_burst_beyond_the_bound_gets_fast_429s_and_the_admitted_requests_complete(bounded: LocalStack) -> None:
    with httpx.Client(base_url=bounded.edge_url, timeout=30) as http:
        reference = http.post("/v1/completions", json={"model": SLOW, "prompt": "tick tock", "max_tokens": MAX_TOKENS})
        assert reference.status_code == 200, reference.text
        expected = reference.json()["choices"][0]["text"]
        llm = next(process for name, process in bounded.children if name == "llm")
        before = rss_bytes(llm.pid)

        with PeakRss(llm.pid) as memory:
            results = asyncio.run(burst(bounded.edge_url))
            serving_under_load = grpc_serving(bounded.service_address("llm"))

        statuses = [status for status, *_ in results]
        assert set(statuses) <= {200, 429}, statuses
        assert statuses.count(429) >= BURST // 2 and statuses.count(200) >= MAX_IN_FLIGHT, statuses
        assert 429 in statuses[1::2]  # a stream refused before its first event is a plain 429 too
        for status, headers, body, elapsed in results:
            if status == 429:
                validate(body, "ErrorResponse")
                assert headers["retry-after"] == "1"
                assert body["error"]["type"] == "rate_limit_error" and body["error"]["code"] == "overloaded"
                assert f"limit of {MAX_IN_FLIGHT} concurrent requests" in body["error"]["message"]
                assert elapsed < 2.0  # refused at once, not queued behind the admitted requests
            elif isinstance(body, str):
                assert streamed_text(body) == expected
            else:
                assert body["choices"][0]["text"] == expected and body["choices"][0]["finish_reason"] == "length"
                assert body["usage"]["completion_tokens"] == MAX_TOKENS
        assert serving_under_load  # health is not counted against the bound
        assert memory.peak - before < RSS_GROWTH_LIMIT, (before, memory.peak)

        after = http.post("/v1/completions", json={"model": SLOW, "prompt": "tick tock", "max_tokens": MAX_TOKENS})
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == expected


@pytest.mark.parametrize(("path", "body", "limit"), [
    ("/v1/completions", {"prompt": "x", "n": 3}, "between 1 and 2 (max_n)"),
    ("/v1/completions", {"prompt": ["x", "y"], "n": 2}, "at most 3 (max_choices)"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 21}, "at most 20 tokens per completion"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 21},
     "at most 20 tokens per completion"),
])
def test_per_model_limits_are_configurable_and_named_in_the_error(bounded: LocalStack, path: str,
                                                                   body: dict[str, Any], limit: str) -> None:
    with httpx.Client(base_url=bounded.edge_url, timeout=30) as http:
        response = http.post(path, json={"model": ECHO, **body})
        assert response.status_code == 400, response.text
        error = response.json()
        validate(error, "ErrorResponse")
        assert error["error"]["param"] == ("n" if "n" in body else "max_tokens") and limit in error["error"]["message"]
        fits = http.post("/v1/completions", json={"model": ECHO, "prompt": "x", "n": 2,
                                                  "max_tokens": LIMITS["max_completion_tokens"]})  # the limit itself
        assert fits.status_code == 200, fits.text
        assert [c["finish_reason"] for c in fits.json()["choices"]] == ["length"] * 2
        assert fits.json()["usage"]["completion_tokens"] == 2 * LIMITS["max_completion_tokens"]
