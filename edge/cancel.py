"""Cancellation on client disconnect for every inference route (vLLM calls it `with_cancellation`).

While the edge waits for a service, nobody reads the HTTP connection, so a client that goes away
would go unnoticed until the answer is ready. `until_disconnected` races the work against the
disconnect: the loser is cancelled, and cancelling the gRPC call cancels the service's work and its
Triton request. `cancelled_on_disconnect` is the watch itself, which the SSE response (edge/sse.py) keeps
while it streams.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from fastapi import Request
from starlette.types import Receive

from edge.errors import OpenAIError

T = TypeVar("T")


@contextlib.contextmanager
def cancelled_on_disconnect(receive: Receive) -> Iterator[Callable[[], bool]]:
    """Inside the block, the current task is cancelled when the client disconnects (once the request's
    body has been read). Yields `disconnected()`, for an `except CancelledError`: True when the
    cancellation came from the client's disconnect, which it then ends (the task is not cancelled any
    more); False for any other cancellation. The work stays in the request's own task: one watcher
    task, no wait set."""
    task = asyncio.current_task()
    assert task is not None
    watching = True

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        if watching and not watcher.cancelled():
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(receive))
    watcher.add_done_callback(on_disconnect)

    def ours() -> bool:
        if watcher.done() and not watcher.cancelled():
            task.uncancel()
            return True
        return False

    try:
        yield ours
    finally:
        watching = False
        watcher.cancel()


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the client disconnects first (then a 499 nobody reads)."""
    with cancelled_on_disconnect(request.receive) as disconnected:
        try:
            return await work
        except asyncio.CancelledError:
            if disconnected():  # it ends here, as a 499
                raise OpenAIError(499, "The client closed the request.", code="cancelled") from None
            raise


async def _disconnected(receive: Receive) -> None:
    # The body has been read: the next message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
