"""Which Triton endpoint of a model takes a generation (`triton_routing` `prefix_aware`): the one that
likely holds its prompt's prefix in its KV cache, unless that endpoint is overloaded.

A generation carries a `Route` (bound in `ROUTE` while it runs): its prompt as chained hashes of
BLOCK_TOKENS-token blocks, and its conversation's affinity key, if any. The choice, in order:
1. a key (the client's `prompt_cache_key`, `user`, session header..., else the conversation's start):
   the endpoint that ranks the key highest (rendezvous hashing over the ready endpoints' addresses), so
   that every llm service replica sends a conversation to the same endpoint without sharing anything,
   and an endpoint that leaves moves only its own conversations, each to its next-ranked endpoint;
2. the endpoint whose record holds the longest prefix of the prompt (`PrefixRecord`: the blocks each
   endpoint was sent recently, least recently used forgotten first);
3. the least-loaded endpoint, as the `least_loaded` rule always does.
A candidate of 1 or 2 is passed over while it is overloaded: its calls in flight exceed the least-loaded
endpoint's by more than `imbalance_calls` and by more than `imbalance_ratio` times.

A cache salt (vLLM's `cache_salt`) is mixed into every block hash and key: two tenants' identical prompts
never share a record entry. Nothing here talks to Triton.
"""

from __future__ import annotations

import functools
import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from tritongate.settings import Settings

BLOCK_TOKENS = 64  # tokens per hashed block (TensorRT-LLM's default KV cache block); a shorter prefix is no reason
Reason = Literal["affinity", "prefix", "load"]


@dataclass(frozen=True)
class RoutingRule:
    """The knobs of the choice (tritongate/settings.py `triton_routing*`)."""

    prefix_aware: bool = True  # False: least-loaded only
    imbalance_calls: int = 2
    imbalance_ratio: float = 1.5
    record_tokens: int = 4_000_000  # prompt tokens the record of a model holds, over all its endpoints

    @classmethod
    def of(cls, settings: Settings) -> RoutingRule:
        return cls(settings.triton_routing == "prefix_aware", settings.triton_routing_imbalance_calls,
                   settings.triton_routing_imbalance_ratio, settings.triton_routing_record_tokens)

    def overloaded(self, in_flight: int, least: int) -> bool:
        return in_flight > least + self.imbalance_calls and in_flight > least * self.imbalance_ratio


def digest(value: str | bytes, salt: bytes = b"") -> bytes:
    """A fixed-size digest of a client's value of any size (never kept raw)."""
    data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
    return hashlib.blake2b(data, digest_size=16, key=salt[:64]).digest()


class Route:
    """What the choice knows of one generation: its prompt (hashed into blocks when first needed: the
    `least_loaded` rule never needs them), its affinity key (None: none), and where its calls went (the last
    pick's endpoint address, and the prompt tokens the record estimated that endpoint held)."""

    def __init__(self, ids: Sequence[int], key: bytes | None = None, salt: bytes = b"") -> None:
        self.ids, self.salt = ids, salt
        self.key = digest(key, salt) if key is not None else None
        self.endpoint = ""
        self.hit_tokens = 0

    @functools.cached_property
    def blocks(self) -> list[int]:
        return block_hashes(self.ids, self.salt)


ROUTE: ContextVar[Route | None] = ContextVar("ROUTE", default=None)


def block_hashes(ids: Sequence[int], salt: bytes = b"") -> list[int]:
    """The chained hashes of the prompt's whole blocks: block i's hash stands for tokens 0 .. (i+1)*BLOCK - 1.
    Tuples of ints hash the same in every process (strings do not)."""
    chain = int.from_bytes(digest(b"prefix", salt)[:8], "little") if salt else 0
    hashes = []
    for start in range(0, len(ids) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
        chain = hash((chain, *ids[start:start + BLOCK_TOKENS]))
        hashes.append(chain)
    return hashes


class PrefixRecord:
    """An approximate, bounded record of the prompt blocks each endpoint was sent recently: block hash → the
    endpoints (a bit each) that were sent it. At most `capacity` blocks; the least recently sent go first,
    a prompt's later blocks before its earlier ones, so that what is left of a prompt is always a prefix."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._blocks: OrderedDict[int, int] = OrderedDict()
        self._bits: dict[str, int] = {}  # endpoint address → its bit
        self._next_bit = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def add(self, blocks: Sequence[int], address: str) -> None:
        """`address` was sent the prompt of `blocks`."""
        bit = self._bits.get(address)
        if bit is None:
            bit = self._bits[address] = 1 << self._next_bit
            self._next_bit += 1
        entries = self._blocks
        for block in reversed(blocks):  # the first block ends up most recent
            entries[block] = entries.pop(block, 0) | bit
        while len(entries) > self.capacity:
            entries.popitem(last=False)

    def forget(self, address: str) -> None:
        """`address`'s cache is gone (it left the rotation): its entries stop counting at once (a bit is never
        given again; its stale entries age out)."""
        self._bits.pop(address, None)

    def matches(self, blocks: Sequence[int], addresses: Iterable[str]) -> dict[str, int]:
        """The longest prefix of `blocks`, in blocks, held for each of `addresses` (those with none left out)."""
        wanted = {address: self._bits[address] for address in addresses if address in self._bits}
        alive = sum(wanted.values())
        found: dict[str, int] = {}
        for i, block in enumerate(blocks):
            alive &= self._blocks.get(block, 0)
            if not alive:
                break
            for address, bit in wanted.items():
                if alive & bit:
                    found[address] = i + 1
        return found


class Candidate(Protocol):
    """What the choice reads of an endpoint (services/common/triton_pool.py `Endpoint`)."""

    @property
    def address(self) -> str: ...
    @property
    def in_flight(self) -> int: ...
    @property
    def last_pick(self) -> int: ...


def rank(key: bytes, address: str) -> bytes:
    """The key's rendezvous weight at `address`: the same in every process."""
    return hashlib.blake2b(address.encode(), digest_size=8, key=key).digest()


@dataclass
class Choice:
    """Where a routed generation goes, why, and the prompt tokens the record says the endpoint holds."""

    endpoint: Candidate
    reason: Reason
    hit_tokens: int = 0
    passed_over: list[str] = field(default_factory=list)  # preferred endpoints that were overloaded


def choose(ready: Sequence[Candidate], route: Route, record: PrefixRecord, rule: RoutingRule) -> Choice:
    """The endpoint of `ready` (not empty) for `route`: by key, then by prefix, then the least loaded."""
    least = min(ready, key=lambda endpoint: (endpoint.in_flight, endpoint.last_pick))
    matches = record.matches(route.blocks, (endpoint.address for endpoint in ready))
    preferred: list[tuple[Candidate, Reason]] = []
    if route.key is not None:
        key = route.key
        preferred.append((max(ready, key=lambda endpoint: rank(key, endpoint.address)), "affinity"))
    by_match = sorted((e for e in ready if e.address in matches), key=lambda e: (-matches[e.address], e.in_flight))
    preferred.extend((endpoint, "prefix") for endpoint in by_match if not preferred or endpoint is not preferred[0][0])
    passed_over: list[str] = []
    for endpoint, reason in preferred:
        if not rule.overloaded(endpoint.in_flight, least.in_flight):
            return Choice(endpoint, reason, matches.get(endpoint.address, 0) * BLOCK_TOKENS, passed_over)
        passed_over.append(endpoint.address)
    return Choice(least, "load", matches.get(least.address, 0) * BLOCK_TOKENS, passed_over)
