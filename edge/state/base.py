"""The state store's interface: state that outlives a request (stored Responses, interactive sessions),
kept where every edge process that answers the same clients can read it.

Values are bytes under a key, in named spaces (`Space`), each with its own bound and idle TTL: a value
unused for the TTL is forgotten; reading or writing one makes it the most recently used. The backends
(memory.py, sqlite.py, redis.py) implement `StateStore`; `open_store` (edge/state/__init__.py) picks one by
URL.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

Change = Callable[[bytes | None], bytes | None]  # the value now (None: absent) → the new one (None: leave it)


class StoreUnavailable(Exception):
    """The store cannot be reached or refused an operation: the request fails with a 503 naming it."""

    def __init__(self, store: str, reason: str) -> None:
        super().__init__(f"The state store ({store}) is unavailable: {reason}")


class StateUrlError(ValueError):
    """TRITONGATE_STATE_URL names no store this edge can open."""


@dataclass(frozen=True)
class Limits:
    """A space's bound and idle TTL."""

    max_entries: int
    ttl_s: float


def redacted(url: str) -> str:
    """`url` without its password (for logs and errors)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:  # unparseable: hide whatever comes before the host
        scheme, _, rest = url.rpartition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}" if "@" in rest else url
    netloc = f"{parts.username or ''}:***@{parts.hostname or ''}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


class StateStore(ABC):
    """Every operation is atomic across all processes that share the store."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.name = redacted(url)  # how errors and logs name it
        self.clock: Callable[[], float] = time.time  # seconds; shared by every process of the store

    def space(self, name: str, limits: Limits) -> Space:
        return Space(self, name, limits)

    @abstractmethod
    async def get(self, space: str, limits: Limits, key: str) -> bytes | None:
        """The value, or None when absent or expired."""

    @abstractmethod
    async def put(self, space: str, limits: Limits, key: str, value: bytes) -> None:
        """Store `value`; beyond the bound, the least recently used values go."""

    @abstractmethod
    async def add(self, space: str, limits: Limits, key: str, value: bytes) -> bytes | None:
        """Store `value` unless `key` has one: returns the value now stored (the earlier one or `value`),
        or None when the space is full (nothing is pushed out)."""

    @abstractmethod
    async def update(self, space: str, limits: Limits, key: str, change: Change) -> bytes | None:
        """Replace the value by `change(value)` with no other writer in between (`change` may run more than
        once); returns what was stored, or None when `change` left it alone."""

    @abstractmethod
    async def delete(self, space: str, key: str) -> None: ...

    @abstractmethod
    async def count(self, space: str, limits: Limits) -> int:
        """Values in the space that have not expired."""

    async def check(self) -> None:
        """Raise StoreUnavailable unless the store answers (run at start)."""
        await self.count("check", Limits(1, 1.0))

    @abstractmethod
    async def close(self) -> None:
        """Release connections."""

    @abstractmethod
    async def items(self, space: str, limits: Limits, prefix: str = "") -> list[tuple[str, bytes]]:
        """The unexpired values whose keys start with `prefix`, ordered by key; reading them is no use (their
        TTL does not start again)."""


@dataclass(frozen=True)
class Space:
    """One kind of state in a store, with its limits: what the endpoints hold on to."""

    store: StateStore
    name: str
    limits: Limits

    async def get(self, key: str) -> bytes | None:
        return await self.store.get(self.name, self.limits, key)

    async def put(self, key: str, value: bytes) -> None:
        await self.store.put(self.name, self.limits, key, value)

    async def add(self, key: str, value: bytes) -> bytes | None:
        return await self.store.add(self.name, self.limits, key, value)

    async def update(self, key: str, change: Change) -> bytes | None:
        return await self.store.update(self.name, self.limits, key, change)

    async def delete(self, key: str) -> None:
        await self.store.delete(self.name, key)

    async def count(self) -> int:
        return await self.store.count(self.name, self.limits)

    async def items(self, prefix: str = "") -> list[tuple[str, bytes]]:
        return await self.store.items(self.name, self.limits, prefix)
