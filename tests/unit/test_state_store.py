"""The shared state store, on each backend (memory, a SQLite file, a real Redis server): bounds, idle TTL,
atomic updates from several stores at once (as several edge processes), failures as StoreUnavailable,
and the URLs that name them."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest

from edge.state import Limits, StateStore, StateUrlError, StoreUnavailable, check_store, open_store, unshared_warning
from edge.state.base import redacted
from edge.state.memory import MemoryStore
from edge.state.redis import RedisStore
from edge.state.sqlite import SqliteStore
from tests.support.clock import Clock
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer

BACKENDS = ["memory", "sqlite", "redis"]


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """One backend's URL; several stores opened on it share their state, as edge processes do."""
    if request.param == "memory":
        return "memory://"
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'state.sqlite3'}"
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture
def clock() -> Clock:
    return Clock(1_000_000.0)


@pytest.fixture
async def stores(url: str, clock: Clock) -> AsyncIterator[list[StateStore]]:
    """Two stores on the same state (one, for memory://, which is one process's own)."""
    opened = [open_store(url)] if url == "memory://" else [open_store(url), open_store(url)]
    for store in opened:
        store.clock = clock
    yield opened
    for store in opened:
        await store.close()


@pytest.fixture
def space() -> str:
    return f"test-{uuid.uuid4().hex}"  # a fresh space per test on the shared Redis server


LIMITS = Limits(max_entries=3, ttl_s=60)


async def test_a_value_put_is_read_back_by_every_store_and_deleted(stores: list[StateStore], space: str) -> None:
    first, last = stores[0], stores[-1]
    assert await first.get(space, LIMITS, "a") is None
    await first.put(space, LIMITS, "a", b"\x00value\xff")
    assert await last.get(space, LIMITS, "a") == b"\x00value\xff"
    assert await last.get("another-" + space, LIMITS, "a") is None  # spaces are apart
    await last.delete(space, "a")
    assert await first.get(space, LIMITS, "a") is None
    assert await first.count(space, LIMITS) == 0


async def test_beyond_the_bound_the_least_recently_used_goes(stores: list[StateStore], space: str,
                                                             clock: Clock) -> None:
    store = stores[0]
    for key in "abc":
        await store.put(space, LIMITS, key, key.encode())
        clock.now += 1
    assert await stores[-1].get(space, LIMITS, "a") == b"a"  # now the most recently used
    clock.now += 1
    await store.put(space, LIMITS, "d", b"d")
    assert [await store.get(space, LIMITS, key) for key in "abcd"] == [b"a", None, b"c", b"d"]
    assert await store.count(space, LIMITS) == 3


async def test_add_keeps_what_is_there_and_refuses_when_full(stores: list[StateStore], space: str) -> None:
    store = stores[0]
    assert await store.add(space, LIMITS, "a", b"first") == b"first"
    assert await stores[-1].add(space, LIMITS, "a", b"second") == b"first"
    assert await store.add(space, LIMITS, "b", b"b") == b"b"
    assert await store.add(space, LIMITS, "c", b"c") == b"c"
    assert await store.add(space, LIMITS, "d", b"d") is None  # full: refused, and nothing pushed out
    assert [await store.get(space, LIMITS, key) for key in "abcd"] == [b"first", b"b", b"c", None]


async def test_a_value_unused_for_the_ttl_is_forgotten_and_use_keeps_it(stores: list[StateStore], space: str,
                                                                        clock: Clock) -> None:
    store = stores[0]
    await store.put(space, LIMITS, "used", b"1")
    await store.put(space, LIMITS, "idle", b"2")
    clock.now += 40
    assert await stores[-1].get(space, LIMITS, "used") == b"1"
    clock.now += 40  # 80 s after the idle one's last use, 40 s after the other's
    assert await store.get(space, LIMITS, "idle") is None
    assert await store.count(space, LIMITS) == 1
    assert await store.update(space, LIMITS, "idle", lambda value: value) is None  # gone for update too
    assert await store.add(space, LIMITS, "idle", b"new") == b"new"


async def test_update_changes_what_is_there_and_leaves_it_when_told(stores: list[StateStore], space: str) -> None:
    store = stores[0]
    assert await store.update(space, LIMITS, "a", lambda value: None if value is None else value + b"!") is None
    assert await store.get(space, LIMITS, "a") is None
    await store.put(space, LIMITS, "a", b"hi")
    assert await stores[-1].update(space, LIMITS, "a", lambda value: (value or b"") + b"!") == b"hi!"
    assert await store.get(space, LIMITS, "a") == b"hi!"


async def test_concurrent_updates_from_several_stores_lose_none(stores: list[StateStore], space: str) -> None:
    await stores[0].put(space, LIMITS, "list", b"[]")

    def append(item: int) -> object:
        return lambda value: orjson.dumps([*orjson.loads(value), item])

    await asyncio.gather(*(stores[i % len(stores)].update(space, LIMITS, "list", append(i)) for i in range(60)))
    stored = await stores[-1].get(space, LIMITS, "list")
    assert stored is not None and sorted(orjson.loads(stored)) == list(range(60))


async def test_an_unreachable_redis_fails_fast_naming_the_store() -> None:
    store = open_store(f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await asyncio.wait_for(store.get("s", LIMITS, "k"), 30)  # a bound for the test, not a timing check
    finally:
        await store.close()
    assert "redis://:***@127.0.0.1:" in str(caught.value) and "hunter2" not in str(caught.value)


async def test_a_sqlite_file_that_cannot_be_created_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(StoreUnavailable, match="a-file"):
        await check_store(f"sqlite://{tmp_path / 'a-file' / 'state.sqlite3'}")


async def test_a_sqlite_too_old_for_the_store_is_refused_at_the_start_check(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sqlite3.sqlite_version_info", (3, 34, 1))
    with pytest.raises(StoreUnavailable, match="too old"):
        await check_store(f"sqlite://{tmp_path / 'state.sqlite3'}")
    assert not (tmp_path / "state.sqlite3").exists()


@pytest.mark.parametrize(("url", "kind"), [
    ("memory://", MemoryStore), ("sqlite:///var/lib/tritongate/state.sqlite3", SqliteStore),
    ("redis://valkey:6379/0", RedisStore), ("redis://valkey", RedisStore), ("valkey://:pw@valkey:6379/2", RedisStore),
    ("rediss://cache.example.com:6380/1", RedisStore),
])
def test_urls_name_their_store(url: str, kind: type[StateStore]) -> None:
    store = open_store(url)
    assert isinstance(store, kind) and "pw" not in store.name


@pytest.mark.parametrize("url", ["", "valkey", "postgres://db/x", "sqlite://", "sqlite://host/x.db", "redis://",
                                 "redis://valkey:port/0", "redis://valkey:6379/zero", "redis://:secret@[::1/0"])
def test_urls_that_name_no_store_are_refused_without_their_password(url: str) -> None:
    with pytest.raises(StateUrlError, match="expected sqlite:///path") as caught:
        open_store(url)
    assert "secret" not in str(caught.value)


def test_redacted_hides_only_the_password() -> None:
    assert redacted("redis://user:pw@host:6379/0") == "redis://user:***@host:6379/0"
    assert redacted("redis://host:6379/0") == "redis://host:6379/0"
    assert redacted("redis://:pw@[::1/0") == "redis://***@[::1/0"  # one that does not parse


@pytest.mark.parametrize(("url", "processes", "warned"), [
    ("memory://", 2, True), ("memory://", 1, False), ("sqlite:///tmp/state.sqlite3", 4, False),
    ("redis://valkey:6379/0", 4, False),
])
def test_only_memory_with_several_edge_processes_is_warned_of(url: str, processes: int, warned: bool) -> None:
    warning = unshared_warning(url, processes)
    assert (warning is not None) == warned
    assert warning is None or f"{processes} edge processes" in warning
