"""Prefix- and session-aware routing (services/common/prefix_routing.py) over two real Tritons, behind two
edge workers and two llm service replicas that each generation reaches in turn (a Generate call per
request, balanced round robin): a conversation's turns stay on one Triton, whose simulated KV cache
(trtllm-echo reports the blocks it reused, 64 tokens each) then serves their shared prefix; conversations
spread over both, and a `previous_response_id` chain stays too; a session header or `prompt_cache_key`
keys a conversation the same way on every replica; a conversation nothing is known of goes to the less
loaded Triton; `cache_salt` gives tenants' identical conversations keys of their own, and one of the wrong
type is refused; a Triton that dies loses its conversations to the other without a failed request. Each
Triton's own statistics say which served a request (one request at a time)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import LocalStack, grpc_serving
from launcher.workers import REPLICA_PORT_STEP
from tests.support.backends import echo_variants
from tests.support.ports import free_port, wait_until
from tests.support.stack import TESTS, metrics_ports, stack_settings
from tritongate.settings import default_cache_dir
from tritongate.triton_local import TritonLaunch, TritonProcess, start_triton

MODEL = "trtllm-echo"
SLOW = f"{MODEL}-slow"  # the same Triton model, 50 ms per token (tests/support/backends.py)
Headers = dict[str, str] | dict[str, bytes] | None
HEADER = "x-session-id"
# A long system prompt that every conversation shares, as agents' do (well over a 64-token block).
SYSTEM = "You are a careful coding agent. " + " ".join(f"Rule {i}: keep the build green." for i in range(24))


@dataclass
class Pair:
    """Tritons `a` and `b` and the stack in front of them."""

    root: Path
    tritons: dict[str, TritonProcess] = field(default_factory=dict)
    stack: LocalStack | None = None

    def start_triton(self, name: str, ports: tuple[int, int, int], models_dir: Path) -> TritonProcess:
        repository = self.root / f"repository-{name}"
        if not repository.exists():
            repository.mkdir()
            (repository / MODEL).symlink_to(TESTS / "triton_models" / MODEL)
        http, grpc, metrics = ports
        self.tritons[name] = start_triton(TritonLaunch(
            repositories=[repository], models_dir=models_dir, cache_dir=default_cache_dir(), http_port=http,
            grpc_port=grpc, metrics_port=metrics, log_path=self.root / f"tritonserver-{name}.log"))
        return self.tritons[name]

    def served(self) -> dict[str, int]:
        """Requests each live Triton has answered since it started (its statistics)."""
        counts = {}
        for name, triton in self.tritons.items():
            if triton.process.poll() is None:
                url = f"http://127.0.0.1:{triton.http_port}/v2/models/{MODEL}/stats"
                stats = httpx.get(url, timeout=10).json()["model_stats"]
                counts[name] = sum(int(s["inference_stats"]["success"]["count"]) for s in stats)
        return counts

    def post(self, path: str, body: dict[str, Any], headers: Headers = None) -> httpx.Response:
        assert self.stack is not None
        return httpx.post(f"{self.stack.edge_url}{path}", json=body, headers=headers, timeout=60)

    def chat(self, messages: list[dict[str, str]], headers: Headers = None, **extra: Any
             ) -> tuple[str, dict[str, Any]]:
        """One turn; the Triton that served it, and the response."""
        return self.turn("/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 8, **extra},
                         headers)

    def turn(self, path: str, body: dict[str, Any], headers: Headers = None) -> tuple[str, dict[str, Any]]:
        before = self.served()
        response = self.post(path, body, headers)
        assert response.status_code == 200, response.text
        # Triton counts a decoupled request once it releases it, a moment after its last response.
        wait_until(lambda: self.served() != before, 10, "Triton to count the request")
        after = self.served()
        [where] = [name for name in after if after[name] > before.get(name, 0)]
        return where, response.json()

    def address(self, name: str) -> str:
        return f"127.0.0.1:{self.tritons[name].grpc_port}"

    def per_endpoint(self, metric: str, model: str) -> list[dict[str, float]]:
        """Each llm replica's samples of an endpoint metric of `model`, by Triton name."""
        names = {self.address(name): name for name in self.tritons}
        return [{names[dict(labels)["endpoint"]]: value for labels, value in replica.items()
                 if dict(labels)["model"] == model} for replica in self.replica_metric(metric)]

    def replica_metric(self, metric: str) -> list[dict[tuple[tuple[str, str], ...], float]]:
        """Each llm replica's samples of `metric`, by labels."""
        assert self.stack is not None
        port = self.stack.metrics_ports["llm"]
        found = []
        for i in range(2):
            text = httpx.get(f"http://127.0.0.1:{port + i * REPLICA_PORT_STEP}/metrics", timeout=5).text
            found.append({tuple(sorted(s.labels.items())): s.value for family in text_string_to_metric_families(text)
                          for s in family.samples if s.name == metric})
        return found


@pytest.fixture(scope="module")
def pair(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    root = tmp_path_factory.mktemp("routing")
    pair = Pair(root)
    try:
        for name in ("a", "b"):
            pair.start_triton(name, (free_port(), free_port(), free_port()), models_dir)
        for triton in pair.tritons.values():
            triton.wait_ready(300)
        addresses = [f"127.0.0.1:{triton.grpc_port}" for triton in pair.tritons.values()]
        full = json.loads((TESTS / "model_config.json").read_text())
        entry = next(entry for entry in full["llm"] if entry["name"] == MODEL)
        slow = next(variant for variant in echo_variants(entry) if variant["name"] == SLOW)
        config = {"llm": [dict(model, url=addresses[0], grpc_url=addresses) for model in (entry, slow)],
                  "model_infos": [{"name": name, "max_len": 4096} for name in (MODEL, SLOW)]}
        (root / "model_config.json").write_text(json.dumps(config))
        settings = stack_settings(root / "model_config.json", models_dir=models_dir)
        pair.stack = LocalStack(settings, triton=pair.tritons["a"], log_dir=root / "logs",
                                metrics_ports=metrics_ports(), processes={"edge": 2, "llm": 2},
                                extra_env={"TRITONGATE_LLM_STREAMS": "0", "TRITONGATE_AFFINITY_HEADER": HEADER})
        pair.stack.start()
        yield pair
    finally:
        if pair.stack is not None:
            pair.stack.stop()
        for triton in pair.tritons.values():
            triton.stop()


def conversation(task: str, turns: int) -> list[dict[str, str]]:
    """A conversation of `turns` user turns, ending with a user message."""
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    for turn in range(1, turns):
        done = f"Step {turn} of {task} done: " + "changed the file and ran the tests again. " * 8  # > 64 tokens
        messages += [{"role": "assistant", "content": done},
                     {"role": "user", "content": f"Go on with step {turn + 1}."}]
    return messages


def cached(response: dict[str, Any]) -> int:
    return int(response["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0))


def test_a_conversations_turns_stay_on_one_triton_and_reuse_its_cache(pair: Pair) -> None:
    homes = {}
    for task in [f"Fix bug {i} in module {i}." for i in range(12)]:
        where = [pair.chat(conversation(task, turns)) for turns in range(1, 5)]
        assert {name for name, _ in where} == {where[0][0]}, (task, where)
        # Each turn reuses the previous turn's prompt, longer each time (the system prompt alone, which every
        # Triton has seen, would not grow).
        reused = [cached(response) for _, response in where]
        assert reused[1] < reused[2] < reused[3], reused
        homes[task] = where[0][0]
    assert set(homes.values()) == {"a", "b"}, homes  # the shared system prompt does not pull them together
    decisions = pair.replica_metric("tritongate_routing_decisions_total")
    for replica in decisions:  # both replicas routed turns, and agreed (every turn stayed)
        assert replica.get((("model", MODEL), ("reason", "affinity")), 0) > 0, decisions
    cached_tokens = pair.replica_metric("tritongate_routing_cached_tokens_total")
    assert sum(sum(replica.values()) for replica in cached_tokens) > 0


def test_a_session_header_and_prompt_cache_key_key_a_conversation(pair: Pair) -> None:
    """Different conversations under one key share a Triton: the key, not the messages, decides."""
    for keyed in ({"headers": {HEADER: "session-1"}}, {"prompt_cache_key": "agent-7"}):
        headers = keyed.pop("headers", None)
        names = {pair.chat(conversation(f"Task {i} of many.", 1), headers, **keyed)[0] for i in range(6)}
        assert len(names) == 1, (keyed, names)
    # Huge, binary-looking keys are hashed, never refused.
    where, _ = pair.chat(conversation("Anything.", 1), prompt_cache_key="\u0000\u00ff\U0001f600" * 200_000)
    assert where in ("a", "b")
    where, _ = pair.chat(conversation("Anything.", 1), {HEADER: b"\xff\xfe" * 2000})
    assert where in ("a", "b")


def test_a_previous_response_id_chain_stays_on_one_triton(pair: Pair) -> None:
    for i in range(4):
        body = {"model": MODEL, "instructions": SYSTEM, "input": f"Plan release {i}.", "max_output_tokens": 8}
        where, response = pair.turn("/v1/responses", body)
        for turn in range(2):
            follow_up = {**body, "input": f"Next step {turn} " * 30, "previous_response_id": response["id"]}
            then, response = pair.turn("/v1/responses", follow_up)
            assert then == where, (i, turn)


def test_the_configured_header_missing_falls_back_to_the_conversation(pair: Pair) -> None:
    first, _ = pair.chat(conversation("No header here.", 1))
    assert all(pair.chat(conversation("No header here.", turns))[0] == first for turns in (2, 3))


def test_cache_salt_keeps_tenants_apart(pair: Pair) -> None:
    """One conversation, word for word, goes to one Triton; under tenants' salts it is each tenant's own."""
    same = conversation("Summarise the quarterly report.", 1)
    assert len({pair.chat(same)[0] for _ in range(3)}) == 1
    salted = {pair.chat(same, cache_salt=f"tenant-{i}")[0] for i in range(16)}
    assert salted == {"a", "b"}
    # and each tenant's own turns still stay put
    assert len({pair.chat(same, cache_salt="tenant-3")[0] for _ in range(3)}) == 1


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
])
@pytest.mark.parametrize("salt", [7, ["a"], {"a": 1}, ""])
def test_a_bad_cache_salt_is_refused_naming_it(pair: Pair, path: str, body: dict[str, Any], salt: Any) -> None:
    response = pair.post(path, {"model": MODEL, **body, "cache_salt": salt})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    if path == "/v1/messages":  # Anthropic's error names no parameter: its message does
        assert "cache_salt" in error["message"], error
    else:
        assert error["param"] == "cache_salt", error


class HeldStream:
    """A slow streamed turn of session `session`, read in a thread of its own until it ends."""

    def __init__(self, url: str, session: str) -> None:
        self.url, self.session = url, session
        self.chunks = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        body = {"model": SLOW, "messages": conversation("Hold on.", 1), "max_tokens": 160, "stream": True}
        with httpx.Client(base_url=self.url, timeout=120) as http, \
                http.stream("POST", "/v1/chat/completions", json=body, headers={HEADER: self.session}) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                self.chunks += 1


def test_a_new_conversation_goes_to_the_less_loaded_triton(pair: Pair) -> None:
    """Turns of one busy session pile up on its Triton (past the imbalance threshold they spill over);
    a conversation nothing is known of goes to the other, whichever replica takes it."""
    assert pair.stack is not None
    home, _ = pair.chat(conversation("Hold on.", 1), {HEADER: "busy"}, model=SLOW, max_tokens=1)
    other = "b" if home == "a" else "a"

    def home_busier_everywhere() -> bool:
        in_flight = pair.per_endpoint("tritongate_triton_endpoint_in_flight", SLOW)
        return all(replica.get(home, 0) > replica.get(other, 0) for replica in in_flight)

    held: list[HeldStream] = []
    while not home_busier_everywhere():
        assert len(held) < 16, pair.per_endpoint("tritongate_triton_endpoint_in_flight", SLOW)
        held.append(HeldStream(pair.stack.edge_url, "busy"))
        wait_until(lambda: held[-1].chunks > 0, 60, "the held stream to start")
    calls = pair.per_endpoint("tritongate_triton_endpoint_calls_total", SLOW)
    response = pair.post("/v1/completions", {"model": SLOW, "prompt": "A conversation nobody has seen.",
                                             "max_tokens": 1})
    assert response.status_code == 200, response.text
    after = pair.per_endpoint("tritongate_triton_endpoint_calls_total", SLOW)
    added = {name: sum(r.get(name, 0) for r in after) - sum(r.get(name, 0) for r in calls) for name in (home, other)}
    assert added == {home: 0, other: 1}, added
    for stream in held:
        stream.thread.join(120)


def test_conversations_keep_their_triton_across_restarts_of_an_edge_worker_and_an_llm_replica(pair: Pair) -> None:
    """Nothing a worker or a replica remembers decides where a conversation goes: killed and started again
    (with an empty prefix record), they send its next turns where the first went."""
    stack = pair.stack
    assert stack is not None
    tasks = [f"Migrate database {i}." for i in range(4)]
    homes = {task: pair.chat(conversation(task, 1))[0] for task in tasks}
    killed = {name: process for name, process in stack.children if name in ("edge-1", "llm-1")}
    assert len(killed) == 2
    for process in killed.values():
        process.kill()
        process.wait()

    def restarted() -> bool:
        stack.supervisor.heal()
        running = {name: process for name, process in stack.children if name in killed}
        return all(running[name] is not killed[name] and running[name].poll() is None for name in killed) and \
            grpc_serving(f"{stack.settings.service_host}:{stack.settings.llm_port}")

    wait_until(restarted, 120, "the edge worker and the llm replica to start again")
    for task in tasks:
        for turns in (2, 3):
            where, response = pair.chat(conversation(task, turns))
            assert where == homes[task], task
            assert cached(response) > 0


def test_a_triton_that_dies_loses_its_conversations_without_a_failed_request(pair: Pair) -> None:
    """Last in the module: Triton B stays down."""
    tasks = [f"Refactor service {i}." for i in range(12)]
    homes = {task: pair.chat(conversation(task, 1))[0] for task in tasks}
    assert "b" in homes.values()
    pair.tritons["b"].kill()
    for task in tasks:  # every turn answered: B's conversations move to A (a call that finds B gone is retried)
        for turns in (2, 3):
            assert pair.chat(conversation(task, turns))[0] == "a"
