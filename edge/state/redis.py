"""`redis://host:port/db` (also `rediss://`, and `valkey://` / `valkeys://` for the same): a Redis or
Valkey server that every edge process of every machine uses, through redis-py's asyncio client.

A space is a key per value (`tritongate:<space>:v:<key>`, expiring after the idle TTL) and a sorted set of
the keys by last use (`tritongate:<space>:used`) for the bound. Each operation but `update` is one Lua
script, so it runs atomically in the server; `update` is an optimistic transaction (WATCH the value,
compute the change here, MULTI/EXEC, again if another writer came first).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import RedisError, WatchError

from edge.state.base import Change, Limits, StateStore, StoreUnavailable

PREFIX = "tritongate"
TIMEOUT_S = 2.0  # connecting and each reply: a server that went away is a quick 503, not a hang

# KEYS: the value's key, the space's index. ARGV: key, now (ms), ttl (ms), max entries, value, value-key prefix.
_COMMON = """
local function purge()
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
end
local function used()
  redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
end
local function store(value)
  redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
  used()
end
local function touch()  -- a value read: its TTL starts again, without writing it again
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  used()
end
local function trim()
  local extra = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
  if extra > 0 then
    local gone = redis.call('ZPOPMIN', KEYS[2], extra)
    for i = 1, #gone, 2 do redis.call('DEL', ARGV[6] .. gone[i]) end
  end
end
"""
GET = _COMMON + """
local used = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not used or tonumber(used) < tonumber(ARGV[2]) - tonumber(ARGV[3]) then return false end
local value = redis.call('GET', KEYS[1])
if value then touch() end
return value
"""
PUT = _COMMON + """
purge()
store(ARGV[5])
trim()
"""
ADD = _COMMON + """
purge()
local value = redis.call('ZSCORE', KEYS[2], ARGV[1]) and redis.call('GET', KEYS[1])
if value then
  touch()
  return value
end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return false end
store(ARGV[5])
return ARGV[5]
"""
COUNT = _COMMON + """
purge()
return redis.call('ZCARD', KEYS[2])
"""
TRIM = _COMMON + """
purge()
trim()
"""


def _ttl_ms(limits: Limits) -> int:
    return max(1, int(limits.ttl_s * 1000))


def client_url(url: str) -> str:
    """redis-py's spelling of `url` (valkey:// is the same protocol)."""
    return url.replace("valkey", "redis", 1) if url.startswith(("valkey://", "valkeys://")) else url


class RedisStore(StateStore):
    def __init__(self, url: str) -> None:
        super().__init__(url)
        # A dropped connection (the server restarted) is retried at once; a server that is down fails fast.
        self._redis = aioredis.from_url(client_url(url), socket_timeout=TIMEOUT_S,
                                        socket_connect_timeout=TIMEOUT_S,
                                        retry=Retry(ExponentialBackoff(cap=0.2, base=0.05), retries=2))
        self._scripts = {name: self._redis.register_script(source)
                         for name, source in (("get", GET), ("put", PUT), ("add", ADD), ("count", COUNT),
                                                         ("trim", TRIM))}

    def _keys(self, space: str, key: str) -> list[str]:
        return [f"{PREFIX}:{space}:v:{key}", f"{PREFIX}:{space}:used"]

    async def _script(self, name: str, space: str, limits: Limits, key: str = "", value: bytes = b"") -> Any:
        args: list[str | int | bytes] = [key, int(self.clock() * 1000), _ttl_ms(limits), limits.max_entries, value,
                                         f"{PREFIX}:{space}:v:"]
        with self._reaching():
            return await self._scripts[name](keys=self._keys(space, key), args=args)

    @contextmanager
    def _reaching(self) -> Iterator[None]:
        """Any failure to reach the server, or a refusal from it (e.g. out of memory), as StoreUnavailable."""
        try:
            yield
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(self.name, str(exc) or type(exc).__name__) from None

    async def get(self, space: str, limits: Limits, key: str) -> bytes | None:
        value: bytes | None = await self._script("get", space, limits, key)
        return value

    async def put(self, space: str, limits: Limits, key: str, value: bytes) -> None:
        await self._script("put", space, limits, key, value)

    async def add(self, space: str, limits: Limits, key: str, value: bytes) -> bytes | None:
        stored: bytes | None = await self._script("add", space, limits, key, value)
        return stored

    async def update(self, space: str, limits: Limits, key: str, change: Change) -> bytes | None:
        value_key, index = self._keys(space, key)
        with self._reaching():
            async with self._redis.pipeline(transaction=True) as pipe:
                while True:
                    try:
                        await pipe.watch(value_key)
                        new = change(await self._fresh(pipe, value_key, index, key, limits))
                        if new is None:
                            await pipe.unwatch()
                            return None
                        pipe.multi()
                        pipe.set(value_key, new, px=_ttl_ms(limits))
                        pipe.zadd(index, {key: int(self.clock() * 1000)})
                        await pipe.execute()
                        break
                    except WatchError:
                        continue  # another writer changed it first: compute the change again
        await self._script("trim", space, limits)
        return new

    async def _fresh(self, pipe: Any, value_key: str, index: str, key: str, limits: Limits) -> bytes | None:
        """The value, unless its last use is older than the TTL (read in the transaction's immediate mode)."""
        used = await pipe.zscore(index, key)
        if used is None or used < (self.clock() - limits.ttl_s) * 1000:
            return None
        return cast("bytes | None", await pipe.get(value_key))

    async def delete(self, space: str, key: str) -> None:
        value_key, index = self._keys(space, key)
        with self._reaching():
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.delete(value_key)
                pipe.zrem(index, key)
                await pipe.execute()

    async def count(self, space: str, limits: Limits) -> int:
        return int(await self._script("count", space, limits))

    async def close(self) -> None:
        await self._redis.aclose()

    async def items(self, space: str, limits: Limits, prefix: str = "") -> list[tuple[str, bytes]]:
        index = f"{PREFIX}:{space}:used"
        with self._reaching():
            used = cast("list[bytes]", await self._redis.zrangebyscore(index, (self.clock() - limits.ttl_s) * 1000,
                                                                       "+inf"))
            keys = sorted(key for key in (raw.decode() for raw in used) if key.startswith(prefix))
            values = await self._redis.mget([f"{PREFIX}:{space}:v:{key}" for key in keys]) if keys else []
        return [(key, value) for key, value in zip(keys, cast("list[bytes | None]", values), strict=True)
                if value is not None]
