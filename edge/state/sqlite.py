"""`sqlite:///path` (the default): a SQLite file in WAL mode that every edge process on this machine
opens; each operation is one transaction that takes the write lock (BEGIN IMMEDIATE), so processes never
interleave. SQLite calls block, so each operation runs whole on the store's one thread: one hand-off per
operation, and no two operations of this process share the connection at once."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from edge.state.base import Change, Limits, StateStore, StoreUnavailable

T = TypeVar("T")
BUSY_TIMEOUT_MS = 5000  # how long a writer waits for another process's transaction
OLDEST_SQLITE = (3, 35, 0)  # reads renew an entry's use with UPDATE ... RETURNING

SCHEMA = """
CREATE TABLE IF NOT EXISTS state (
    space TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, used REAL NOT NULL, PRIMARY KEY (space, key)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS state_by_use ON state (space, used);
"""


class SqliteStore(StateStore):
    def __init__(self, url: str, path: Path) -> None:
        super().__init__(url)
        self.path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-sqlite")
        self._db: sqlite3.Connection | None = None  # opened on the store's thread

    async def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._in_thread, operation)

    def _in_thread(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return operation(self._connection())
        except (sqlite3.Error, OSError) as exc:
            raise StoreUnavailable(self.name, str(exc)) from None

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            if sqlite3.sqlite_version_info < OLDEST_SQLITE:  # refused at the start check, not at the first read
                raise sqlite3.NotSupportedError(f"SQLite {sqlite3.sqlite_version} is too old (3.35 or later needed); "
                                                "use redis:// or memory://")
            self.path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")  # WAL keeps the file consistent; this state may lose a write
            db.executescript(SCHEMA)
            self._db = db
        return self._db

    async def get(self, space: str, limits: Limits, key: str) -> bytes | None:
        def get(db: sqlite3.Connection) -> bytes | None:
            now = self.clock()
            row = db.execute("UPDATE state SET used = ? WHERE space = ? AND key = ? AND used >= ? RETURNING value",
                             (now, space, key, now - limits.ttl_s)).fetchone()
            return None if row is None else bytes(row[0])

        return await self._run(get)

    async def put(self, space: str, limits: Limits, key: str, value: bytes) -> None:
        def put(db: sqlite3.Connection) -> None:
            with _writing(db, space, limits, self.clock()) as now:
                _set(db, space, key, value, now)
                _trim(db, space, limits)

        await self._run(put)

    async def add(self, space: str, limits: Limits, key: str, value: bytes) -> bytes | None:
        def add(db: sqlite3.Connection) -> bytes | None:
            with _writing(db, space, limits, self.clock()) as now:
                found = _value(db, space, key)
                if found is None:
                    (count,) = db.execute("SELECT count(*) FROM state WHERE space = ?", (space,)).fetchone()
                    if count >= limits.max_entries:
                        return None
                _set(db, space, key, found or value, now)
                return found or value

        return await self._run(add)

    async def update(self, space: str, limits: Limits, key: str, change: Change) -> bytes | None:
        def update(db: sqlite3.Connection) -> bytes | None:
            with _writing(db, space, limits, self.clock()) as now:
                new = change(_value(db, space, key))
                if new is not None:
                    _set(db, space, key, new, now)
                    _trim(db, space, limits)
                return new

        return await self._run(update)

    async def delete(self, space: str, key: str) -> None:
        await self._run(lambda db: db.execute("DELETE FROM state WHERE space = ? AND key = ?", (space, key)))

    async def count(self, space: str, limits: Limits) -> int:
        def count(db: sqlite3.Connection) -> int:
            row = db.execute("SELECT count(*) FROM state WHERE space = ? AND used >= ?",
                             (space, self.clock() - limits.ttl_s)).fetchone()
            return int(row[0])

        return await self._run(count)

    async def close(self) -> None:
        def close(db: sqlite3.Connection) -> None:
            db.close()
            self._db = None

        if self._db is not None:
            await self._run(close)
        self._thread.shutdown(wait=False)

    async def items(self, space: str, limits: Limits, prefix: str = "") -> list[tuple[str, bytes]]:
        def items(db: sqlite3.Connection) -> list[tuple[str, bytes]]:
            # substr, not LIKE: a key's own % and _ are no wildcards
            rows = db.execute("SELECT key, value FROM state WHERE space = ? AND used >= ? AND substr(key, 1, ?) = ? "
                              "ORDER BY key", (space, self.clock() - limits.ttl_s, len(prefix), prefix)).fetchall()
            return [(str(key), bytes(value)) for key, value in rows]

        return await self._run(items)


@contextmanager
def _writing(db: sqlite3.Connection, space: str, limits: Limits, now: float) -> Iterator[float]:
    """A write transaction on `space` at time `now`, its expired values gone first; yields `now`."""
    db.execute("BEGIN IMMEDIATE")
    try:
        db.execute("DELETE FROM state WHERE space = ? AND used < ?", (space, now - limits.ttl_s))
        yield now
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _value(db: sqlite3.Connection, space: str, key: str) -> bytes | None:
    row = db.execute("SELECT value FROM state WHERE space = ? AND key = ?", (space, key)).fetchone()
    return None if row is None else bytes(row[0])


def _set(db: sqlite3.Connection, space: str, key: str, value: bytes, now: float) -> None:
    db.execute("INSERT INTO state (space, key, value, used) VALUES (?, ?, ?, ?) "
               "ON CONFLICT (space, key) DO UPDATE SET value = excluded.value, used = excluded.used",
               (space, key, value, now))


def _trim(db: sqlite3.Connection, space: str, limits: Limits) -> None:
    """Beyond the bound, the least recently used go."""
    db.execute("DELETE FROM state WHERE space = ? AND key IN "
               "(SELECT key FROM state WHERE space = ? ORDER BY used DESC LIMIT -1 OFFSET ?)",
               (space, space, limits.max_entries))
