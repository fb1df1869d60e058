"""Load processes: `--load-processes N` spawns N processes (each its own event loop) that share each point's
concurrency, so that one Python client is not what limits the rate (bench/common.py's `bench_main` starts
them; a benchmark's `run` hands them its `Load`).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
from collections.abc import Callable, Coroutine
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Load:
    """A benchmark's load as a load process runs it: `task(ready, *args, path, concurrency, seconds)`, a
    module-level coroutine function (a spawned process imports it) that opens its own clients, warms up,
    calls `ready()` and measures `path` ("direct_triton" or "edge") at `concurrency` for `seconds`."""

    task: Callable[..., Coroutine[Any, Any, Any]]
    args: tuple[Any, ...]


@dataclass(frozen=True)
class LoadTarget:
    """What a load process opens its own clients to: the private stack's Triton (gRPC) and edge, and the
    tokenizer the benchmark's direct path uses."""

    grpc_url: str
    edge_url: str
    tokenizer_path: str


def _share(load: Load, barrier: Any, path: str, concurrency: int, seconds: float) -> Any:
    """One load process's share of a point."""
    return asyncio.run(load.task(lambda: barrier.wait(BARRIER_TIMEOUT_S), *load.args, path, concurrency, seconds))


BARRIER_TIMEOUT_S = 300.0  # loading the clients, the tokenizer and the warm-up


class LoadProcesses:
    """`n` spawned processes (each its own event loop) that share each point's concurrency; every share
    warms up, then all start together (a barrier, which the caller passes too before `started()`), so
    that their measurement windows coincide. The caller merges what the shares return."""

    def __init__(self, n: int) -> None:
        context = multiprocessing.get_context("spawn")  # never fork a process with gRPC and event loops
        self.n = n
        self.manager = context.Manager()
        self.pool = ProcessPoolExecutor(n, mp_context=context)

    async def run(self, load: Load, path: str, concurrency: int, seconds: float,
                  started: Callable[[], None]) -> list[Any]:
        shares = [concurrency // self.n + (i < concurrency % self.n) for i in range(min(self.n, concurrency))]
        barrier = self.manager.Barrier(len(shares) + 1)
        loop = asyncio.get_running_loop()
        futures = [loop.run_in_executor(self.pool, _share, load, barrier, path, share, seconds) for share in shares]
        waiting = asyncio.ensure_future(asyncio.to_thread(barrier.wait, BARRIER_TIMEOUT_S))
        while not waiting.done():
            await asyncio.wait([waiting, *futures], return_when=asyncio.FIRST_COMPLETED)
            if any(f.done() and f.exception() for f in futures):  # a share failed before it was ready
                barrier.abort()
                break
        with contextlib.suppress(Exception):
            await waiting
        started()
        return list(await asyncio.gather(*futures))

    def close(self) -> None:
        self.pool.shutdown(cancel_futures=True)
        self.manager.shutdown()


LOAD: dict[str, LoadProcesses] = {}  # the benchmark's load processes, when `--load-processes` asks for them


def load_processes() -> LoadProcesses | None:
    return LOAD.get("processes")
