"""A mixed load on the whole stack: 64 concurrent clients for a bounded time, each cycling through a
streamed chat completion (ft-echo), an embeddings batch and a rerank request.

Every response must be a complete success (no request is expected to fail at this load), and the resident
memory of the edge and of each service after the load must be within 50 MB of what it was after a
warm-up round of the same mix.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.stack import LocalStack
from tests.support.streams import parse_events

CLIENTS = 64
WARMUP_S = 4.0
LOAD_S = 12.0
MEMORY_SLACK_MB = 50.0
CHAT_MODEL, EMBED_MODEL, RERANK_MODEL = "ft-echo", "all-minilm-l6-v2", "minilm-rerank"
CHAT_TOKENS = 8
EMBED_DIMENSIONS = 384
HTTPX_KEEP_ALIVE_S = httpx.Limits().keepalive_expiry or 5.0


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` and of every process below it, in MB."""
    pids, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            children = {int(child) for child in task.read_text().split()} - pids
            pids |= children
            frontier.extend(children)
    total_kb = 0
    for each in pids:
        try:
            status = Path(f"/proc/{each}/status").read_text()
        except FileNotFoundError:  # ended meanwhile
            continue
        total_kb += next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return total_kb / 1024


def memory(stack: LocalStack) -> dict[str, float]:
    return {name: rss_mb(process.pid) for name, process in stack.children}


@dataclass
class Tally:
    """What the clients saw: completed requests by kind, and every unexpected outcome."""

    chat_text: str
    done: Counter[str] = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)


async def chat_stream(http: httpx.AsyncClient, client: int, tally: Tally) -> None:
    body = {"model": CHAT_MODEL, "stream": True, "max_tokens": CHAT_TOKENS,
            "messages": [{"role": "user", "content": f"client {client} says hello"}]}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        raw = (await response.aread()).decode()
    assert response.status_code == 200, f"chat: {response.status_code} {raw[:300]}"
    events = parse_events(raw)
    assert events and events[-1].data == "[DONE]", f"chat: the stream did not end with [DONE]: {raw[-300:]}"
    assert all(e.name is None for e in events), f"chat: error event: {raw[-300:]}"
    chunks = [json.loads(e.data) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == tally.chat_text, f"chat: {text!r} != {tally.chat_text!r}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def embeddings(http: httpx.AsyncClient, client: int, tally: Tally) -> None:
    texts = [f"client {client} sentence {i} about load" for i in range(1 + client % 4)]
    response = await http.post("/v1/embeddings", json={"model": EMBED_MODEL, "input": texts,
                                                        "encoding_format": "float"})
    assert response.status_code == 200, f"embeddings: {response.status_code} {response.text[:300]}"
    data = response.json()["data"]
    assert [d["index"] for d in data] == list(range(len(texts))), "embeddings: wrong rows"
    assert all(len(d["embedding"]) == EMBED_DIMENSIONS for d in data), "embeddings: wrong dimensions"


async def rerank(http: httpx.AsyncClient, client: int, tally: Tally) -> None:
    documents = ["Paris is the capital of France.", "A cat sleeps.", "Berlin is in Germany.",
                 "Rust has no garbage collector.", "The Seine flows through Paris."][: 2 + client % 4]
    response = await http.post("/v1/rerank", json={"model": RERANK_MODEL, "query": "capital of France",
                                                    "documents": documents})
    assert response.status_code == 200, f"rerank: {response.status_code} {response.text[:300]}"
    results = response.json()["results"]
    assert sorted(r["index"] for r in results) == list(range(len(documents))), "rerank: wrong results"
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True), "rerank: not sorted by score"


KINDS = [chat_stream, embeddings, rerank]


async def client_loop(http: httpx.AsyncClient, client: int, until: float, tally: Tally) -> None:
    turn = client  # clients start on different kinds, so that every kind is in flight at once
    while time.monotonic() < until:
        kind = KINDS[turn % len(KINDS)]
        turn += 1
        try:
            await kind(http, client, tally)
        except (AssertionError, httpx.HTTPError) as exc:
            tally.errors.append(f"{kind.__name__}: {type(exc).__name__}: {exc}")
        else:
            tally.done[kind.__name__] += 1


async def run_load(base_url: str, seconds: float, tally: Tally) -> None:
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=CLIENTS)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as http:
        until = time.monotonic() + seconds
        loops = [client_loop(http, client, until, tally) for client in range(CLIENTS)]
        await asyncio.wait_for(asyncio.gather(*loops), timeout=seconds + 120)


@pytest.fixture(scope="module")
def chat_text(stack: LocalStack) -> str:
    """ft-echo's answer (the same for every client: the echo starts with the chat template's system part)."""
    body = {"model": CHAT_MODEL, "max_tokens": CHAT_TOKENS, "messages": [{"role": "user", "content": "client"}]}
    response = httpx.post(f"{stack.edge_url}/v1/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    text = response.json()["choices"][0]["message"]["content"]
    assert text
    return str(text)


async def test_mixed_load_succeeds_and_memory_stays_flat(stack: LocalStack, chat_text: str) -> None:
    assert {name for name, _ in stack.children} == {"edge", "llm", "embed", "rerank"}
    warmup = Tally(chat_text)
    await run_load(stack.edge_url, WARMUP_S, warmup)
    assert not warmup.errors, warmup.errors[:5]
    before = memory(stack)

    tally = Tally(chat_text)
    started = time.monotonic()
    await run_load(stack.edge_url, LOAD_S, tally)
    elapsed = time.monotonic() - started
    after = memory(stack)

    rates = {kind: round(count / elapsed, 1) for kind, count in tally.done.items()}
    growth = {name: round(after[name] - before[name], 1) for name in before}
    print(f"\n[load] {CLIENTS} clients, {elapsed:.1f} s: completed {dict(tally.done)} ({rates} per s), "
          f"{len(tally.errors)} errors; RSS MB before {_rounded(before)}, after {_rounded(after)}, "
          f"growth {growth}")
    assert not tally.errors, f"{len(tally.errors)} failed requests; first ones: {tally.errors[:5]}"
    assert set(tally.done) == {kind.__name__ for kind in KINDS}, tally.done
    assert stack.failed_child() is None, stack.failed_child()
    for name in before:
        assert abs(after[name] - before[name]) < MEMORY_SLACK_MB, (name, before[name], after[name])


def _rounded(values: dict[str, Any]) -> dict[str, float]:
    return {name: round(value, 1) for name, value in values.items()}



def test_an_idle_connection_outlives_the_clients_keep_alive(stack: LocalStack) -> None:
    """httpx (and so the openai and anthropic SDKs) reuses a connection idle for up to 5 s: the edge must keep
    it open longer, or a request sent just as the edge closes it fails with a reset (seen under the load above).
    """
    conn = http.client.HTTPConnection(stack.edge_url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", "/health")
        first = conn.getresponse()
        first.read()
        assert first.status == 200
        opened = conn.sock
        time.sleep(HTTPX_KEEP_ALIVE_S + 1)
        conn.request("GET", "/health")  # on a connection the edge closed, this fails (RemoteDisconnected)
        second = conn.getresponse()
        second.read()
        assert second.status == 200 and conn.sock is opened
    finally:
        conn.close()
