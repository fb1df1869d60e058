"""BoundedStore: least recently used out when full, unused entries forgotten after the TTL."""

from __future__ import annotations

import pytest

from edge import store as store_module
from edge.store import BoundedStore


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(store_module.time, "monotonic", lambda: now[0])
    return now


def test_the_least_recently_used_goes_first_when_full(clock: list[float]) -> None:
    store: BoundedStore[int] = BoundedStore(max_entries=2, ttl_s=60)
    store.put("a", 1)
    store.put("b", 2)
    assert store.get("a") == 1  # "b" is now the least recently used
    assert store.full()
    store.put("c", 3)
    assert store.get("b") is None and store.get("a") == 1 and store.get("c") == 3 and len(store) == 2


def test_entries_unused_for_the_ttl_are_forgotten(clock: list[float]) -> None:
    store: BoundedStore[str] = BoundedStore(max_entries=10, ttl_s=60)
    store.put("old", "x")
    clock[0] += 30
    store.put("new", "y")
    clock[0] += 40  # "old" unused for 70 s, "new" for 40 s
    assert store.get("old") is None and store.get("new") == "y"
    clock[0] += 59
    assert store.get("new") == "y"  # reading it kept it alive
    assert store.pop("new") == "y" and len(store) == 0
