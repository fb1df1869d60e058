"""Cancellation on client disconnect for every inference route (vLLM calls it `with_cancellation`).

While the edge waits for a service, nobody reads the HTTP connection, so a client that goes away
would go unnoticed until the answer is ready. `until_disconnected` races the work against the
disconnect: the loser is cancelled, and cancelling the gRPC call cancels the service's work and its
Triton request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from fastapi import Request

from edge.errors import OpenAIError

T = TypeVar("T")


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the client disconnects first (then a 499 nobody reads). The work runs in the
    request's own task (no task and no wait set per request); a watcher cancels that task on disconnect."""
    task = asyncio.current_task()
    assert task is not None
    waiting = True

    def disconnected(watcher: asyncio.Future[None]) -> None:
        if waiting and not watcher.cancelled():
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(disconnected)
    try:
        return await work
    except asyncio.CancelledError:
        if watcher.done() and not watcher.cancelled():
            task.uncancel()  # the cancellation was ours: it ends here, as a 499
            raise OpenAIError(499, "The client closed the request.", code="cancelled") from None
        raise
    finally:
        waiting = False
        watcher.cancel()


async def _disconnected(request: Request) -> None:
    # The body has been read: the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
