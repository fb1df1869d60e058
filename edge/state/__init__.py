"""Where the edge keeps state that outlives a request, shared by every edge process that points at the
same store (TRITONGATE_STATE_URL; docs/configuration.md#shared-state):

- `sqlite:///path` (the default: a file in tritongate's state folder): every edge process of one machine;
- `redis://host:port/db` (Redis or Valkey; `rediss://` for TLS): every edge process of every machine;
- `memory://`: this process only (one edge process, nothing to share).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from edge.state.base import Limits, Space, StateStore, StateUrlError, StoreUnavailable, redacted

__all__ = ["Limits", "Space", "StateStore", "StateUrlError", "StoreUnavailable", "check_store", "open_store",
           "unshared_warning"]

REDIS_SCHEMES = ("redis", "rediss", "valkey", "valkeys")
EXPECTED = "expected sqlite:///path, redis://host:port/db (or valkey://, rediss://) or memory://"


def open_store(url: str) -> StateStore:
    """The store `url` names (nothing is connected yet); StateUrlError when it names none."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsed lazily: a bad port raises here
    except ValueError as exc:
        raise StateUrlError(f"TRITONGATE_STATE_URL {redacted(url)!r} does not parse ({exc}); {EXPECTED}") from None
    if parts.scheme == "memory":
        from edge.state.memory import MemoryStore

        return MemoryStore(url)
    if parts.scheme == "sqlite" and not parts.netloc and parts.path not in ("", "/"):
        from edge.state.sqlite import SqliteStore

        return SqliteStore(url, Path(parts.path))
    database = parts.path.strip("/")
    if parts.scheme in REDIS_SCHEMES and parts.hostname and (database == "" or database.isdigit()):
        from edge.state.redis import RedisStore

        return RedisStore(url)
    raise StateUrlError(f"TRITONGATE_STATE_URL {redacted(url)!r} names no store: {EXPECTED}")


async def check_store(url: str) -> str:
    """Open the store and make sure it answers (StateUrlError, StoreUnavailable); returns its name."""
    store = open_store(url)
    try:
        await store.check()
    finally:
        await store.close()
    return store.name


def unshared_warning(url: str, edge_processes: int) -> str | None:
    """What to warn of when several edge processes would each keep their own state (`memory://`)."""
    if edge_processes > 1 and urlsplit(url).scheme == "memory":
        return (f"TRITONGATE_STATE_URL=memory:// keeps stored Responses and interactive sessions in each of the "
                f"{edge_processes} edge processes: a follow-up that reaches another process will not find them")
    return None
