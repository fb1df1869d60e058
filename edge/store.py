"""A bounded in-memory store with an idle TTL: stored Responses (`previous_response_id`) and LMDeploy-style
interactive sessions. It lives in one edge process: several edge replicas each keep their own (see
docs/endpoints.md for what that means behind a load balancer).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Generic, TypeVar

T = TypeVar("T")


class BoundedStore(Generic[T]):
    """At most `max_entries` values; one unused for `ttl_s` seconds is dropped. Reading or writing a
    value makes it the most recently used; when full, the least recently used goes first."""

    def __init__(self, max_entries: int, ttl_s: float) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._entries: OrderedDict[str, tuple[float, T]] = OrderedDict()

    def _expire(self, now: float) -> None:
        while self._entries:
            used, _ = next(iter(self._entries.values()))
            if now - used <= self.ttl_s:
                return
            self._entries.popitem(last=False)

    def get(self, key: str) -> T | None:
        now = time.monotonic()
        self._expire(now)
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries[key] = (now, entry[1])
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: str, value: T) -> None:
        now = time.monotonic()
        self._expire(now)
        self._entries[key] = (now, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def full(self) -> bool:
        """True when a new key would push out another one."""
        self._expire(time.monotonic())
        return len(self._entries) >= self.max_entries

    def pop(self, key: str) -> T | None:
        entry = self._entries.pop(key, None)
        return None if entry is None else entry[1]

    def __len__(self) -> int:
        self._expire(time.monotonic())
        return len(self._entries)
