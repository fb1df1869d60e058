"""Named keys end to end: two edge processes on one real Redis, keys made with `tritongate keys`, requests
through the openai SDK and raw HTTP to the session's real services. A tokens-per-minute limit holds across
both edges; a key for the embedding model only finds no chat model; a revoked key stops working on every
edge; the usage each key is counted matches the responses' usage."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from launcher.stack import LocalStack
from tests.support.edges import create_key, edges, keys_command, usage
from tests.support.metrics import total
from tests.support.ports import wait_until
from tests.support.redis_server import RedisServer

CHAT = "ft-echo"
EMBEDDING = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def keys_store(redis_server: RedisServer) -> str:
    """A database of its own on the session's Redis: the keys made here must not turn authentication on for
    the other modules' edges on that Redis."""
    return redis_server.url.removesuffix("/0") + "/7"


@pytest.fixture(scope="module")
def redis_edges(stack: LocalStack, keys_store: str,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with edges(stack, {"TRITONGATE_STATE_URL": keys_store}, tmp_path_factory.mktemp("keys"), 2) as urls:
        yield urls


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def chat(url: str, key: str, **fields: Any) -> httpx.Response:
    body = {"model": CHAT, "messages": [{"role": "user", "content": "count the tokens of this"}], "max_tokens": 4,
            **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                      timeout=60)


def test_a_tokens_per_minute_limit_holds_across_two_edges(redis_edges: list[str], keys_store: str) -> None:
    limit = 300
    key = create_key(keys_store, name("tpm"), "--tpm", str(limit))
    served: list[int] = []
    refused: httpx.Response | None = None
    for i in range(100):
        response = chat(redis_edges[i % 2], key)
        if response.status_code == 429:
            refused = response
            break
        assert response.status_code == 200, response.text
        assert int(response.headers["x-ratelimit-limit-tokens"]) == limit
        served.append(response.json()["usage"]["total_tokens"])
    assert refused is not None, "no request was refused"
    error = refused.json()["error"]
    assert error["code"] == "rate_limit_exceeded" and error["type"] == "tokens" and key not in refused.text
    assert int(refused.headers["retry-after"]) >= 1 and refused.headers["x-ratelimit-remaining-tokens"] == "0"
    # Both edges served, and together about what the one limit allows (it drains 5 tokens a second
    # meanwhile); a limit per edge would have let twice as much through before the first refusal.
    assert len(served) >= 2 and sum(served) >= limit - max(served)
    assert sum(served) < 1.5 * limit


def test_a_key_for_the_embedding_model_only_finds_no_chat_model(redis_edges: list[str],
                                                                keys_store: str) -> None:
    key = create_key(keys_store, name("embed-only"), "--models", EMBEDDING)
    client = openai.OpenAI(base_url=f"{redis_edges[0]}/v1", api_key=key, max_retries=0, timeout=60)
    assert client.embeddings.create(model=EMBEDDING, input="hello").data[0].embedding
    assert [model.id for model in client.models.list()] == [EMBEDDING]
    forbidden = chat(redis_edges[1], key)
    unknown = chat(redis_edges[1], key, model="no-such-model")
    assert forbidden.status_code == unknown.status_code == 404
    assert forbidden.json()["error"] == {**unknown.json()["error"],
                                         "message": unknown.json()["error"]["message"].replace("no-such-model", CHAT)}
    assert forbidden.json()["error"]["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve(CHAT)


def test_a_revoked_key_stops_working_on_every_edge(redis_edges: list[str], keys_store: str) -> None:
    key_name = name("revoked")
    key = create_key(keys_store, key_name)
    for url in redis_edges:
        assert chat(url, key).status_code == 200
    done = keys_command(keys_store, "revoke", key_name)
    assert done.returncode == 0, done.stderr
    for url in redis_edges:  # polled: each edge keeps a lookup for half a second at most
        wait_until(lambda url=url: chat(url, key).status_code == 401, 10, f"the revocation on {url}")
    assert chat(redis_edges[0], key).json()["error"]["code"] == "invalid_api_key"


def test_usage_counts_match_the_responses_usage(redis_edges: list[str], keys_store: str) -> None:
    key_name = name("usage")
    key = create_key(keys_store, key_name)
    prompt = completion = 0
    for i in range(4):
        client = openai.OpenAI(base_url=f"{redis_edges[i % 2]}/v1", api_key=key, max_retries=0, timeout=60)
        answer = client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": f"turn {i}"}],
                                                max_tokens=3)
        assert answer.usage is not None
        prompt, completion = prompt + answer.usage.prompt_tokens, completion + answer.usage.completion_tokens
    stream = client.chat.completions.create(model=CHAT, messages=[{"role": "user", "content": "streamed"}],
                                            max_tokens=3, stream=True, stream_options={"include_usage": True})
    streamed = [chunk.usage for chunk in stream if chunk.usage is not None][-1]
    prompt, completion = prompt + streamed.prompt_tokens, completion + streamed.completion_tokens
    embedded = client.embeddings.create(model=EMBEDDING, input=["one", "two"]).usage.prompt_tokens
    counted = usage(keys_store, key_name)
    assert counted[CHAT] == {"requests": 5, "prompt_tokens": prompt, "completion_tokens": completion,
                             "cached_tokens": 0}
    assert counted[EMBEDDING] == {"requests": 1, "prompt_tokens": embedded, "completion_tokens": 0,
                                  "cached_tokens": 0}
    scrapes = [httpx.get(f"{url}/metrics", timeout=10).text for url in redis_edges]
    assert sum(total(s, "tritongate_key_requests_total", key=key_name, model=CHAT) for s in scrapes) == 5
    assert sum(total(s, "tritongate_key_tokens_total", key=key_name, model=CHAT, kind="completion")
               for s in scrapes) == completion
    assert all(key not in scrape for scrape in scrapes)


@pytest.mark.parametrize("priority", [101, -101, "high", 1.5, True])
def test_a_priority_out_of_range_or_not_an_integer_is_a_400_naming_it(redis_edges: list[str],
                                                                    keys_store: str,
                                                                    priority: Any) -> None:
    key = create_key(keys_store, name("priority"))
    response = chat(redis_edges[0], key, priority=priority)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "priority"
    embedded = httpx.post(f"{redis_edges[1]}/v1/embeddings", json={"model": EMBEDDING, "input": "x",
                                                                   "priority": priority},
                          headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert embedded.status_code == 400 and embedded.json()["error"]["param"] == "priority"
    assert chat(redis_edges[0], key, priority=-100).status_code == 200


def test_keys_without_a_key_are_refused_once_any_key_is_stored(redis_edges: list[str], tmp_path: Path) -> None:
    response = httpx.get(f"{redis_edges[0]}/v1/models", timeout=10)
    assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
