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
    """`work`, cancelled if the client disconnects first (then a 499 nobody reads)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if not task.done() or task.cancelled():
        raise OpenAIError(499, "The client closed the request.", code="cancelled")
    return task.result()


async def _disconnected(request: Request) -> None:
    # The body has been read: the next message is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass
