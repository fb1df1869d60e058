"""deploy/compose.yaml for real, with podman and podman-compose: the stack comes up healthy and answers
through the edge's published port; a service scaled up under load takes traffic without a failed request;
a crashed service replica or Triton fails no request it should not, and everything comes back by itself; two edge
replicas share stored Responses through Valkey; `down -v` leaves nothing behind.

The tests run in file order on one compose project (each builds on the state the one before left), and
state in the run's results what they measured. The machine has two cores for all of it: waits are
generous and nothing asserts a time."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from tests.containers.compose import Compose
from tests.containers.conftest import SERVICES, save_logs
from tests.support.load import Load
from tests.support.ports import wait_until
from tritongate.settings import DEPLOY_DIR

pytestmark = pytest.mark.containers

MODELS = json.loads((DEPLOY_DIR / "model_config.compose.json").read_text())
LLM, EMBED, RERANK = (MODELS[section][0]["name"] for section in ("llm", "embedding", "rerank"))
REPLICAS = 3
# A new replica starts (seconds) and gets traffic once the edge re-resolves the service's name: when a
# service closes an aged connection (TRITONGATE_MAX_CONNECTION_AGE_MS, 30 s in compose.yaml). The wait
# allows a slow start and several rounds.
NEW_REPLICA_WAIT_S = 360
RESTART_WAIT_S = 600  # Triton reloads the demo models after its restart


def client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="none", timeout=120, max_retries=0)


def edge(stack: Compose, replica: int = 0) -> str:
    return stack.edge_url(stack.containers("edge")[replica])


def embeddings(stack: Compose) -> Load:
    """Steady embeddings load on the published edge port from three threads (a stream, not a flood: the
    machine has two cores for everything)."""
    return Load(edge(stack), {"embed": ("/v1/embeddings", lambda worker, n: {
        "model": EMBED, "input": f"load {worker}-{n}: the quick brown fox"})}, threads=3)


KINDS = {"chat", "embed", "rerank"}


def every_kind(stack: Compose) -> Load:
    """One thread each of short chats, embeddings and reranks on the published edge port."""
    return Load(edge(stack), {
        "chat": ("/v1/chat/completions", {"model": LLM, "max_tokens": 4, "temperature": 0,
                                          "messages": [{"role": "user", "content": "Say hello."}]}),
        "embed": ("/v1/embeddings", {"model": EMBED, "input": "the quick brown fox"}),
        "rerank": ("/v1/rerank", {"model": RERANK, "query": "What is the capital of France?",
                                  "documents": ["Bananas are yellow.", "Paris is the capital of France."]}),
    }, pause_s=0.1)


def test_every_service_comes_up_healthy_and_answers(stack: Compose) -> None:
    for service in SERVICES:
        assert stack.containers(service), f"no running {service} container"
    (models,) = stack.containers("models", running=False)
    assert stack.state(models)["ExitCode"] == 0  # the one-shot fetched the demo models and exited

    api = client(edge(stack))
    assert {m.id for m in api.models.list().data} >= {LLM, EMBED, RERANK}
    chat = api.chat.completions.create(model=LLM, temperature=0, max_tokens=16,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in (chat.choices[0].message.content or "")
    vectors = api.embeddings.create(model=EMBED, input=["The food was delicious", "The cat sat on the mat"]).data
    assert len(vectors) == 2 and len(vectors[0].embedding) == 384
    ranked = httpx.post(f"{edge(stack)}/v1/rerank", timeout=60, json={
        "model": RERANK, "query": "What is the capital of France?",
        "documents": ["Bananas are yellow.", "Paris is the capital of France."]})
    assert ranked.status_code == 200, ranked.text
    assert ranked.json()["results"][0]["index"] == 1


def test_embed_scaled_up_under_load_every_new_replica_serves_and_no_request_fails(
        stack: Compose, results: dict[str, Any]) -> None:
    (first,) = stack.containers("embed")
    with embeddings(stack) as load:
        wait_until(lambda: len(load.outcomes) >= 20, 60, "load before the scale-up")
        scaled_at = time.monotonic()
        stack.up("--scale", f"embed={REPLICAS}")
        scale_command_s = round(time.monotonic() - scaled_at, 1)
        replicas = stack.containers("embed")
        assert len(replicas) == REPLICAS and first in replicas
        added = [name for name in replicas if name != first]
        first_served: dict[str, float] = {}  # seconds from the scale command to each new replica's first answer

        def all_served() -> bool:
            for name in added:
                if name not in first_served and stack.handled(name, "Embed") > 0:
                    first_served[name] = round(time.monotonic() - scaled_at, 1)
            return len(first_served) == len(added)

        wait_until(all_served, NEW_REPLICA_WAIT_S, f"embed requests on each of {added}")
        # Then how the edge spreads the load over all of them.
        settled, settled_at = {name: stack.handled(name, "Embed") for name in replicas}, time.monotonic()
        wait_until(lambda: len(load.since(settled_at)) >= 300, 180, "300 more embeddings")
        spread = {name: stack.handled(name, "Embed") - settled[name] for name in replicas}
    results["scale_embed_under_load"] = {
        "replicas": REPLICAS, "requests": len(load.outcomes), "failed": len(load.failed()),
        "requests_after_scale_command": len(load.since(scaled_at)), "scale_command_s": scale_command_s,
        "first_request_after_scale_command_s": first_served, "then_requests_per_replica": spread}
    assert load.failed() == [], load.failed()[:3]
    assert all(spread.values()), spread


def test_a_crashed_embed_replica_fails_no_embedding_and_is_restarted(stack: Compose, results: dict[str, Any]) -> None:
    replicas = stack.containers("embed")
    assert len(replicas) == REPLICAS, "runs after the scale-up test"
    victim, survivors = replicas[-1], replicas[:-1]
    with embeddings(stack) as load:
        wait_until(lambda: len(load.outcomes) >= 20, 60, "load before the kill")
        before = {name: stack.handled(name, "Embed") for name in survivors}
        killed_at = time.monotonic()
        stack.crash(victim)
        wait_until(lambda: len(load.since(killed_at)) >= 200, 180, "200 embeddings after the kill")
        wait_until(lambda: stack.healthy(victim), RESTART_WAIT_S, f"{victim} restarted by its restart policy")
        back_after = round(time.monotonic() - killed_at, 1)
    results["kill_embed_replica"] = {"requests_after_kill": len(load.since(killed_at)),
                                     "failed": len(load.failed()), "healthy_again_after_s": back_after}
    assert load.failed() == []
    assert all(stack.handled(name, "Embed") > before[name] for name in survivors)
    assert stack.restarts(victim) >= 1


def test_while_triton_is_down_requests_get_503_with_retry_after_then_all_comes_back(
        stack: Compose, results: dict[str, Any]) -> None:
    (triton,) = stack.containers("triton")
    with every_kind(stack) as load:
        wait_until(lambda: load.ok_since(0) == KINDS, 120, "chat, embeddings and rerank before the kill")
        killed_at = time.monotonic()
        stack.crash(triton)
        wait_until(lambda: any(o.status == 503 for o in load.since(killed_at)), 120, "a 503 while Triton is gone")
        down_at = time.monotonic()  # a request sent from here on succeeds only once Triton is back

        def back() -> dict[str, float]:
            return {kind: at for kind in sorted(KINDS) if (at := load.first_ok(kind, down_at)) is not None}

        wait_until(lambda: stack.healthy(triton), RESTART_WAIT_S, "Triton restarted by its restart policy")
        wait_until(lambda: len(back()) == len(KINDS), 300, "chat, embeddings and rerank answered again")
    failed = load.failed(killed_at)
    back_after = {kind: round(at - killed_at, 1) for kind, at in back().items()}
    results["kill_triton"] = {
        "requests_after_kill": len(load.since(killed_at)), "not_200": len(failed),
        "statuses": sorted({str(o.status) for o in failed}),
        "not_200_by_kind": {kind: sum(o.name == kind for o in failed) for kind in sorted(KINDS)},
        "answering_again_after_s": back_after}
    assert failed, "no request failed while Triton was down"
    assert all(o.status == 503 and o.retry_after for o in failed), failed[:3]
    assert all(json.loads(o.text)["error"]["type"] for o in failed)  # the OpenAI error body
    assert load.failed(0) == failed  # nothing failed before Triton went away
    assert stack.restarts(triton) >= 1


def test_two_edge_replicas_share_stored_responses_through_valkey(stack: Compose) -> None:
    stack.up("--scale", "edge=2")
    replicas = stack.containers("edge")
    assert len(replicas) == 2
    stack.wait_healthy(replicas, 300)
    first, second = (client(stack.edge_url(name)) for name in replicas)
    assert first.base_url != second.base_url

    stored = first.responses.create(model=LLM, input="My name is Ada. Say hello to me.", store=True,
                                    max_output_tokens=16, temperature=0)
    fetched = second.responses.retrieve(stored.id)
    assert fetched.id == stored.id and fetched.output_text == stored.output_text
    follow_up = second.responses.create(model=LLM, input="What is my name?", previous_response_id=stored.id,
                                        max_output_tokens=16, temperature=0)
    assert follow_up.previous_response_id == stored.id and follow_up.output_text


def test_down_removes_every_container_volume_and_network(stack: Compose) -> None:
    assert stack.leftovers()["volumes"], "the models volume exists before `down -v`"
    save_logs(stack)  # this run's logs, while the containers still exist
    stack.down()
    assert stack.leftovers() == {"containers": [], "pods": [], "networks": [], "volumes": []}
