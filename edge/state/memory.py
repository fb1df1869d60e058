"""`memory://`: the state in this process's memory. Only for a single edge process (`--workers 1`, one
replica): another process would not see it."""

from __future__ import annotations

from collections import OrderedDict

from edge.state.base import Change, Limits, StateStore


class BoundedDict:
    """At most `max_entries` values, least recently used first; one unused for `ttl_s` is dropped."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[float, bytes]] = OrderedDict()

    def expire(self, limits: Limits, now: float) -> None:
        while self._entries:
            used, _ = next(iter(self._entries.values()))
            if now - used <= limits.ttl_s:
                return
            self._entries.popitem(last=False)

    def get(self, key: str, now: float) -> bytes | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self.set(key, entry[1], now)
        return entry[1]

    def set(self, key: str, value: bytes, now: float) -> None:
        self._entries[key] = (now, value)
        self._entries.move_to_end(key)

    def trim(self, limits: Limits) -> None:
        while len(self._entries) > limits.max_entries:
            self._entries.popitem(last=False)

    def pop(self, key: str) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)

    def items(self, prefix: str) -> list[tuple[str, bytes]]:
        return sorted((key, value) for key, (_, value) in self._entries.items() if key.startswith(prefix))


class MemoryStore(StateStore):
    """Each operation runs without an await inside it, so it is atomic within the event loop."""

    def __init__(self, url: str = "memory://") -> None:
        super().__init__(url)
        self._spaces: dict[str, BoundedDict] = {}

    def _space(self, space: str, limits: Limits) -> tuple[BoundedDict, float]:
        """The space's values, those expired gone, and the time now."""
        values = self._spaces.setdefault(space, BoundedDict())
        now = self.clock()
        values.expire(limits, now)
        return values, now

    async def get(self, space: str, limits: Limits, key: str) -> bytes | None:
        values, now = self._space(space, limits)
        return values.get(key, now)

    async def put(self, space: str, limits: Limits, key: str, value: bytes) -> None:
        values, now = self._space(space, limits)
        values.set(key, value, now)
        values.trim(limits)

    async def add(self, space: str, limits: Limits, key: str, value: bytes) -> bytes | None:
        values, now = self._space(space, limits)
        found = values.get(key, now)
        if found is not None:
            return found
        if len(values) >= limits.max_entries:
            return None
        values.set(key, value, now)
        return value

    async def update(self, space: str, limits: Limits, key: str, change: Change) -> bytes | None:
        values, now = self._space(space, limits)
        new = change(values.get(key, now))
        if new is not None:
            values.set(key, new, now)
            values.trim(limits)
        return new

    async def delete(self, space: str, key: str) -> None:
        if space in self._spaces:
            self._spaces[space].pop(key)

    async def count(self, space: str, limits: Limits) -> int:
        return len(self._space(space, limits)[0])

    async def close(self) -> None:
        self._spaces.clear()

    async def items(self, space: str, limits: Limits, prefix: str = "") -> list[tuple[str, bytes]]:
        return self._space(space, limits)[0].items(prefix)
