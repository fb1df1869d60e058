"""The keys and their accounts in the shared state store, so that every edge process and replica sees
the same keys, the same rate levels and the same usage:

- `keys`: `name:<name>` → the key's policy (JSON, its digest inside; kept after revocation for its usage),
  `digest:<sha256>` → the name (deleted on revocation), `index` → every name (JSON list);
- `key-accounts`: `<name>` → the key's rate levels, budget spent and usage by model (JSON), each change one
  atomic update of the store.

Rates are leaky buckets: a level that drains at the limit per minute, continuously, so a limit holds the
same wherever a minute starts. Lookups are cached for `CACHE_S` at most, so that a revoked key stops
working on every edge within a second.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from edge.keys.policy import UNRESTRICTED, KeyPolicy, PolicyError, check_policy, digest, new_key
from edge.state import Limits, StateStore, StoreUnavailable

CACHE_S = 0.5
FOREVER = Limits(max_entries=10_000_000, ttl_s=100 * 365 * 86400.0)
USAGE_FIELDS = ("requests", "prompt_tokens", "completion_tokens", "cached_tokens")


@dataclass(frozen=True)
class Refusal:
    """Why a key's request is refused now: `kind` (requests, tokens or budget) and when to try again."""

    kind: str
    limit: int
    retry_after_s: float


@dataclass(frozen=True)
class Levels:
    """A key's limits and what is left of them right now (for the x-ratelimit-* headers)."""

    rpm: int | None
    requests_left: int
    requests_reset_s: float
    tpm: int | None
    tokens_left: int
    tokens_reset_s: float


def _drain(account: dict[str, Any], policy: KeyPolicy, now: float) -> None:
    """Let the buckets drain for the time since their last change; a new budget period starts at 0."""
    elapsed = max(0.0, now - account.get("at", now))
    account["at"] = now
    if policy.rpm:
        account["r"] = max(0.0, account.get("r", 0.0) - elapsed * policy.rpm / 60)
    if policy.tpm:
        account["t"] = max(0.0, account.get("t", 0.0) - elapsed * policy.tpm / 60)
    window = int(now // policy.budget_period_s) if policy.budget_period_s else 0
    if account.get("bw", window) != window:
        account["b"] = 0
    account["bw"] = window


def _refusal(account: dict[str, Any], policy: KeyPolicy, now: float) -> Refusal | None:
    if policy.rpm and account.get("r", 0.0) + 1 > policy.rpm:
        return Refusal("requests", policy.rpm, (account["r"] + 1 - policy.rpm) * 60 / policy.rpm)
    if policy.tpm and account.get("t", 0.0) >= policy.tpm:
        return Refusal("tokens", policy.tpm, (account["t"] - policy.tpm + 1) * 60 / policy.tpm)
    if policy.budget and account.get("b", 0) >= policy.budget:
        left = (policy.budget_period_s - now % policy.budget_period_s) if policy.budget_period_s else math.inf
        return Refusal("budget", policy.budget, left)
    return None


def _levels(account: dict[str, Any], policy: KeyPolicy) -> Levels:
    requests, tokens = account.get("r", 0.0), account.get("t", 0.0)
    return Levels(policy.rpm, max(0, math.floor(policy.rpm - requests)) if policy.rpm else 0,
                  requests * 60 / policy.rpm if policy.rpm else 0.0,
                  policy.tpm, max(0, math.floor(policy.tpm - tokens)) if policy.tpm else 0,
                  tokens * 60 / policy.tpm if policy.tpm else 0.0)


class KeyRing:
    """The keys an edge accepts: those of its settings (unrestricted, named `default`) and those in the store."""

    def __init__(self, store: StateStore, configured: Iterable[str] = ()) -> None:
        self.keys = store.space("keys", FOREVER)
        self.accounts = store.space("key-accounts", FOREVER)
        self.clock = store.clock
        self._configured = frozenset(digest(key.encode()) for key in configured)
        self._cache: dict[str, tuple[float, KeyPolicy | None]] = {}  # digest or "name:..." → (when, policy)
        self._any: tuple[float, bool] = (-math.inf, False)

    # Authentication.

    async def required(self) -> bool:
        """Whether requests need a key: some are configured, or some exist in the store. Once this process has
        seen stored keys it keeps requiring one: a store that loses its data (a restarted Valkey without
        persistence) must not open the gateway to everyone. While the store is unreachable the last answer
        stands, so that requests that need no store are still served; without one yet, StoreUnavailable."""
        if self._configured:
            return True
        when, found = self._any
        if not found and time.monotonic() - when > CACHE_S:
            try:
                found = bool(await self.names())
            except StoreUnavailable:
                if when == -math.inf:  # never known: refuse rather than guess
                    raise
            self._any = (time.monotonic(), found)
        return found

    async def lookup(self, key: bytes) -> KeyPolicy | None:
        """The policy of the presented key; None for no key of ours or a revoked one."""
        hashed = digest(key)
        if hashed in self._configured:
            return UNRESTRICTED
        return await self._cached(hashed, self._by_digest)

    async def by_name(self, name: str) -> KeyPolicy | None:
        """The policy of the key called `name` (an in-process request's); None when unknown or revoked."""
        if name == UNRESTRICTED.name and self._configured:
            return UNRESTRICTED
        return await self._cached(f"name:{name}", self._live)

    async def _cached(self, entry: str, fetch: Any) -> KeyPolicy | None:
        now = time.monotonic()
        hit = self._cache.get(entry)
        if hit is not None and now - hit[0] <= CACHE_S:
            return hit[1]
        policy: KeyPolicy | None = await fetch(entry.removeprefix("name:"))
        if len(self._cache) > 10_000:  # presented garbage must not grow it without bound
            self._cache.clear()
        self._cache[entry] = (now, policy)
        return policy

    async def _by_digest(self, hashed: str) -> KeyPolicy | None:
        name = await self.keys.get(f"digest:{hashed}")
        if name is None:
            return None
        policy = await self._live(name.decode())
        return policy if policy is not None and policy.digest == hashed else None

    async def _live(self, name: str) -> KeyPolicy | None:
        policy = await self.policy(name)
        return None if policy is None or policy.revoked else policy

    # Management (`tritongate keys`).

    async def policy(self, name: str) -> KeyPolicy | None:
        value = await self.keys.get(f"name:{name}")
        return None if value is None else KeyPolicy.from_json(value)

    async def names(self) -> list[str]:
        value = await self.keys.get("index")
        return [] if value is None else list(json.loads(value))

    async def create(self, policy: KeyPolicy) -> str:
        """Store a new key with `policy` (its name unused, or used by a revoked key); returns the key."""
        check_policy(policy)
        key = new_key()
        stored = replace(policy, digest=digest(key.encode()), created=int(self.clock()), revoked=False)

        def claim(value: bytes | None) -> bytes | None:
            if value is not None and not KeyPolicy.from_json(value).revoked:
                raise PolicyError(f"a key named {policy.name!r} exists; revoke it first")
            return stored.to_json()

        await self.keys.update(f"name:{policy.name}", claim)
        await self.keys.put(f"digest:{stored.digest}", policy.name.encode())
        await self.keys.update("index", lambda value: json.dumps(
            sorted({*(json.loads(value) if value else ()), policy.name})).encode())
        return key

    async def revoke(self, name: str) -> KeyPolicy:
        policy = await self.policy(name)
        if policy is None:
            raise PolicyError(f"no key named {name!r}")
        if policy.revoked:
            raise PolicyError(f"the key {name!r} is revoked already")
        await self.keys.delete(f"digest:{policy.digest}")
        await self.keys.put(f"name:{name}", policy.revoke().to_json())
        return policy

    async def usage(self, name: str) -> dict[str, dict[str, int]]:
        """Requests and tokens by model."""
        value = await self.accounts.get(name)
        usage: dict[str, list[int]] = {} if value is None else json.loads(value).get("usage", {})
        return {model: dict(zip(USAGE_FIELDS, counts, strict=True)) for model, counts in usage.items()}

    # Limits and usage, per request.

    async def admit(self, policy: KeyPolicy) -> Refusal | Levels:
        """Count a request against the key's limits: its levels, or why it is refused (nothing counted)."""
        outcome: Refusal | Levels = _levels({}, policy)

        def take(value: bytes | None) -> bytes | None:
            nonlocal outcome
            account = json.loads(value) if value else {}
            now = self.clock()
            _drain(account, policy, now)
            refusal = _refusal(account, policy, now)
            if refusal is not None:
                outcome = refusal
                return None
            if policy.rpm:
                account["r"] = account.get("r", 0.0) + 1
            outcome = _levels(account, policy)
            return json.dumps(account).encode()

        await self.accounts.update(policy.name, take)
        return outcome

    async def record(self, policy: KeyPolicy, model: str, prompt: int, completion: int, cached: int) -> None:
        """Add a served request's usage to the key's account (its buckets, budget and totals by model)."""

        def add(value: bytes | None) -> bytes:
            account = json.loads(value) if value else {}
            _drain(account, policy, self.clock())
            tokens = prompt + completion
            if policy.tpm:
                account["t"] = account.get("t", 0.0) + tokens
            if policy.budget:
                account["b"] = account.get("b", 0) + tokens
            counts = account.setdefault("usage", {}).setdefault(model, [0] * len(USAGE_FIELDS))
            for i, amount in enumerate((1, prompt, completion, cached)):
                counts[i] += amount
            return json.dumps(account).encode()

        await self.accounts.update(policy.name, add)
