"""Cancellation on client disconnect: the work is cancelled when the client goes first."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from edge.errors import OpenAIError
from edge.lean import until_disconnected


class FakeRequest:
    """What until_disconnected reads: ASGI receive(), which answers http.disconnect when `gone` is set."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def test_the_work_is_cancelled_when_the_client_disconnects() -> None:
    request = FakeRequest()
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def work() -> str:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    async def leave() -> None:
        await started.wait()
        request.gone.set()

    leaving = asyncio.create_task(leave())
    with pytest.raises(OpenAIError) as info:
        await until_disconnected(request, work())  # type: ignore[arg-type]
    await asyncio.wait_for(cancelled.wait(), 1)
    assert info.value.status == 499 and info.value.code == "cancelled"
    await leaving


async def test_the_result_and_failures_of_the_work_pass_through() -> None:
    async def answer() -> str:
        return "done"

    async def fail() -> str:
        raise OpenAIError(504, "too slow")

    assert await until_disconnected(FakeRequest(), answer()) == "done"  # type: ignore[arg-type]
    with pytest.raises(OpenAIError) as info:
        await until_disconnected(FakeRequest(), fail())  # type: ignore[arg-type]
    assert info.value.status == 504
