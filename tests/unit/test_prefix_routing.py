"""The choice of Triton endpoint for a generation (services/common/prefix_routing.py, through
services/common/triton_pool.py): the record of prefixes, keys by rendezvous hashing, the imbalance
threshold, salts, endpoints that leave; the keys the edge sends (edge/generation.py) and the conversation
key the llm service derives (services/llm/model.py). Endpoints are the pool's own, their readiness scripted;
tests/e2e/test_prefix_routing.py runs two real Tritons."""

from __future__ import annotations

import itertools
from collections import Counter
from contextlib import ExitStack

from prometheus_client import REGISTRY

from edge.generation import Affinity, GenerationInput, SamplingRequest, affinity_header
from services.common.prefix_routing import BLOCK_TOKENS, PrefixRecord, Route, RoutingRule, block_hashes
from services.common.triton_pool import TritonPool
from services.llm.model import conversation_key
from tritongate.llm.v1 import llm_pb2
from tritongate.triton_address import parse_triton_address

A, B, C = "10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.3:8001"
RULE = RoutingRule()
model_ids = (f"routed-{i}" for i in itertools.count())


async def ready_pool(*addresses: str) -> TritonPool:
    pool = TritonPool([parse_triton_address(address) for address in addresses], next(model_ids))
    assert await pool.refresh(_ready) is None
    return pool


async def _ready(address: str) -> str | None:
    return None


def prompt(conversation: int, tokens: int) -> list[int]:
    """A conversation's prompt: the same ids for its first `tokens` whatever the turn."""
    return [conversation * 100_000 + i for i in range(tokens)]


def pick(pool: TritonPool, ids: list[int], key: bytes | None = None, salt: bytes = b"", rule: RoutingRule = RULE
         ) -> str:
    endpoint = pool.pick(route=Route(ids, key, salt), rule=rule)
    assert endpoint is not None
    return endpoint.address


def decisions(pool: TritonPool, reason: str) -> float:
    return REGISTRY.get_sample_value("tritongate_routing_decisions_total", {"model": pool.name, "reason": reason}) or 0


def test_blocks_are_whole_chained_and_salted() -> None:
    ids = list(range(3 * BLOCK_TOKENS + 5))
    hashes = block_hashes(ids)
    assert len(hashes) == 3 and hashes == block_hashes(ids[: 3 * BLOCK_TOKENS])  # a partial block is left out
    assert block_hashes(ids[BLOCK_TOKENS:])[0] != hashes[1]  # a block's hash stands for everything before it
    assert block_hashes(ids, b"tenant-a") != hashes != block_hashes(ids, b"tenant-b")
    assert block_hashes(list(range(BLOCK_TOKENS - 1))) == []


def test_the_record_finds_each_endpoints_longest_prefix() -> None:
    record = PrefixRecord(1000)
    ten = block_hashes(prompt(1, 10 * BLOCK_TOKENS))
    record.add(ten[:4], A)
    record.add(ten[:7], B)
    assert record.matches(ten, [A, B, C]) == {A: 4, B: 7}
    assert record.matches(block_hashes(prompt(2, 10 * BLOCK_TOKENS)), [A, B]) == {}
    record.forget(B)  # its cache is gone: its entries count no more, and a new one starts afresh
    assert record.matches(ten, [A, B]) == {A: 4}
    record.add(ten[:2], B)
    assert record.matches(ten, [A, B]) == {A: 4, B: 2}


def test_the_record_is_bounded_and_forgets_a_prompts_end_first() -> None:
    record = PrefixRecord(10)
    first = block_hashes(prompt(1, 8 * BLOCK_TOKENS))
    record.add(first, A)
    record.add(block_hashes(prompt(2, 4 * BLOCK_TOKENS)), B)
    assert len(record) == 10
    assert record.matches(first, [A]) == {A: 6}  # its last two blocks went; what is left is still a prefix


async def test_a_conversation_sticks_to_its_endpoint_as_it_grows() -> None:
    pool = await ready_pool(A, B)
    first = pick(pool, prompt(1, 4 * BLOCK_TOKENS))
    other = pick(pool, prompt(2, 4 * BLOCK_TOKENS))
    assert other != first  # nothing recorded for it: the least loaded (equals take turns)
    for turn in range(2, 10):
        assert pick(pool, prompt(1, turn * 4 * BLOCK_TOKENS)) == first
        assert pick(pool, prompt(2, turn * 4 * BLOCK_TOKENS)) == other
    assert decisions(pool, "prefix") == 16 and decisions(pool, "load") == 2
    hit = REGISTRY.get_sample_value("tritongate_routing_prefix_hit_tokens_total", {"model": pool.name, "endpoint": A})
    assert hit == sum(turn * 4 * BLOCK_TOKENS for turn in range(1, 9))


async def test_an_overloaded_endpoint_passes_its_conversations_on() -> None:
    pool = await ready_pool(A, B)
    ids = prompt(1, 4 * BLOCK_TOKENS)
    home = pick(pool, ids)
    endpoint = pool.endpoints[home]
    with ExitStack() as calls:
        for _ in range(RULE.imbalance_calls):  # the other endpoint has none: still within the threshold
            calls.enter_context(pool.calling(endpoint))
        assert pick(pool, ids) == home
        calls.enter_context(pool.calling(endpoint))
        assert pick(pool, ids) != home
        assert decisions(pool, "load") == 2
        imbalance = REGISTRY.get_sample_value("tritongate_routing_imbalance", {"model": pool.name})
        assert imbalance == RULE.imbalance_calls + 1
    # The call that went elsewhere left its prompt there too: the two now hold it, the less loaded wins.
    with ExitStack() as calls:
        calls.enter_context(pool.calling(endpoint))
        assert pick(pool, ids) != home


async def test_the_imbalance_threshold_is_relative_too() -> None:
    pool = await ready_pool(A, B)
    ids = prompt(1, 4 * BLOCK_TOKENS)
    home = pick(pool, ids)
    endpoint, other = pool.endpoints[home], pool.endpoints[A if home == B else B]
    rule = RoutingRule(imbalance_calls=0)  # 5 in flight against 4 is within 1.5 times; 7 against 4 is not
    with ExitStack() as calls:
        for _ in range(5):
            calls.enter_context(pool.calling(endpoint))
        for _ in range(4):
            calls.enter_context(pool.calling(other))
        assert pick(pool, ids, rule=rule) == home
        calls.enter_context(pool.calling(endpoint))
        calls.enter_context(pool.calling(endpoint))
        assert pick(pool, ids, rule=rule) == other.address


async def test_least_loaded_ignores_the_route() -> None:
    pool = await ready_pool(A, B)
    rule = RoutingRule(prefix_aware=False)
    ids = prompt(1, 4 * BLOCK_TOKENS)
    assert [pick(pool, ids, rule=rule) for _ in range(4)] == [A, B, A, B]
    assert decisions(pool, "load") == 0 and pool.record is None
    route = Route(ids)
    assert pool.pick(route=route, rule=rule) is pool.endpoints[A]
    pool.count_usage(route, 128, 64)  # the backend's reuse is counted all the same
    labels = {"model": pool.name, "endpoint": A}
    assert REGISTRY.get_sample_value("tritongate_routing_cached_tokens_total", labels) == 64
    assert "blocks" not in vars(route)  # never hashed


async def test_a_key_picks_the_same_endpoint_in_every_replica() -> None:
    keys = [f"conversation-{i}".encode() for i in range(64)]
    replicas = [await ready_pool(A, B, C) for _ in range(2)]
    chosen = [[pick(pool, [], key) for key in keys] for pool in replicas]
    assert chosen[0] == chosen[1]
    assert min(Counter(chosen[0]).values()) >= 10  # spread over the endpoints
    assert decisions(replicas[0], "affinity") == 64
    # A salt makes another key of the same value: the tenants land independently.
    salted = [pick(replicas[0], [], key, b"tenant") for key in keys]
    assert salted != chosen[0]


async def test_the_key_wins_over_a_shared_prefix() -> None:
    """Agents that share a long system prompt keep to their own keys' endpoints, not the one that served it."""
    pool = await ready_pool(A, B)
    system = prompt(0, 8 * BLOCK_TOKENS)
    pick(pool, system)  # the system prompt is recorded on one endpoint
    keys = [f"agent-{i}".encode() for i in range(16)]
    chosen = Counter(pick(pool, system + prompt(i + 1, BLOCK_TOKENS), key) for i, key in enumerate(keys))
    assert set(chosen) == {A, B}


async def test_an_endpoint_that_leaves_loses_only_its_conversations() -> None:
    pool = await ready_pool(A, B, C)
    keys = [f"conversation-{i}".encode() for i in range(30)]
    before = {key: pick(pool, prompt(i, 2 * BLOCK_TOKENS), key) for i, key in enumerate(keys)}
    states = {A: None, B: None, C: "Triton reports it not ready"}

    async def check(address: str) -> str | None:
        return states[address]

    await pool.refresh(check)
    after = {key: pick(pool, prompt(i, 2 * BLOCK_TOKENS), key) for i, key in enumerate(keys)}
    assert all(after[key] == before[key] for key in keys if before[key] != C)
    assert C not in after.values() and any(address == C for address in before.values())
    # Back in with an empty cache: the record holds nothing of it any more.
    states[C] = None
    await pool.refresh(check)
    assert pool.record is not None and pool.record.matches(block_hashes(prompt(0, 2 * BLOCK_TOKENS)), [C]) == {}


async def test_a_retry_avoids_the_endpoint_that_failed() -> None:
    pool = await ready_pool(A, B)
    route = Route(prompt(1, 4 * BLOCK_TOKENS), b"key")
    first = pool.pick(route=route, rule=RULE)
    assert first is not None
    second = pool.pick(avoid=first, route=route, rule=RULE)
    assert second is not None and second is not first and route.endpoint == second.address


async def test_usage_is_counted_per_endpoint() -> None:
    pool = await ready_pool(A, B)
    route = Route(prompt(1, 4 * BLOCK_TOKENS))
    endpoint = pool.pick(route=route, rule=RULE)
    assert endpoint is not None
    pool.count_usage(route, 128, 96)
    labels = {"model": pool.name, "endpoint": endpoint.address}
    assert REGISTRY.get_sample_value("tritongate_routing_prompt_tokens_total", labels) == 128
    assert REGISTRY.get_sample_value("tritongate_routing_cached_tokens_total", labels) == 96


def test_the_edge_sends_digests_and_the_header_wins() -> None:
    huge = "\udcff" * 1_000_000  # huge, and not even valid UTF-8: travels as a 16-byte digest
    generation = GenerationInput(model="m", sampling=SamplingRequest(), affinity=Affinity(huge, "salt"))
    proto = generation.proto()
    assert len(proto.affinity_key) == 16 and len(proto.cache_salt) == 16
    assert generation.proto("session-1").affinity_key not in (proto.affinity_key, b"")
    assert GenerationInput(model="m", sampling=SamplingRequest()).proto().affinity_key == b""
    headers = {"x-session-id": "s1"}
    assert affinity_header(headers, "x-session-id") == "s1"
    assert affinity_header(headers, "x-other") is None and affinity_header(headers, None) is None


def test_a_chat_is_keyed_by_its_start() -> None:
    def chat(*messages: tuple[str, str]) -> llm_pb2.GenerateRequest:
        return llm_pb2.GenerateRequest(chat=llm_pb2.Chat(messages=[
            llm_pb2.ChatMessage(role=role, content=content) for role, content in messages]))

    system, first = ("system", "You are a coding agent."), ("user", "Fix the build.")
    turn1 = conversation_key(chat(system, first))
    turn3 = conversation_key(chat(system, first, ("assistant", "Done."), ("user", "Now the tests.")))
    assert turn1 is not None and turn1 == turn3
    assert conversation_key(chat(system, ("user", "Write docs."))) != turn1  # same system prompt, other agent
    keyed = chat(system, first)
    keyed.affinity_key = b"client-key"
    assert conversation_key(keyed) == b"client-key"
    assert conversation_key(llm_pb2.GenerateRequest(prompts=llm_pb2.Prompts())) is None
