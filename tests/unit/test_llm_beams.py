"""Beam search's shared request: the choices of a prompt take their beams from one backend stream, the
beams of its last step, and the stream is closed once every choice has gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator

from services.llm.backends import Step
from services.llm.beams import BeamSearch


class Stream:
    """A backend stream that records how often it was started and whether it was closed."""

    def __init__(self, steps: list[Step], hold: asyncio.Event | None = None) -> None:
        self.steps = steps
        self.hold = hold
        self.started = 0
        self.closed = False

    async def run(self) -> AsyncGenerator[Step, None]:
        self.started += 1
        try:
            for step in self.steps:
                yield step
            if self.hold is not None:
                await self.hold.wait()
        finally:
            self.closed = True


async def test_the_choices_share_one_request_and_take_the_last_beams() -> None:
    stream = Stream([Step(beams=[[1], [2]]), Step(beams=[[1, 3], [4, 5], [6]])])  # rewritten, then a third beam
    search = BeamSearch(stream.run(), 4)

    async def take(rank: int) -> list[list[int]]:
        return [step.token_ids async for step in search.choice(rank)]

    assert await asyncio.gather(*(take(rank) for rank in range(4))) == [[[1, 3]], [[4, 5]], [[6]], []]
    assert stream.started == 1 and stream.closed


async def settle() -> None:
    """Let the event loop run what is ready (the shared task, cancellations)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_the_request_is_cancelled_once_every_choice_has_gone() -> None:
    stream = Stream([Step(beams=[[1], [2]])], hold=asyncio.Event())  # a search that has not ended
    search = BeamSearch(stream.run(), 2)
    choices = [search.choice(rank) for rank in range(2)]
    waiting = [asyncio.ensure_future(anext(choice)) for choice in choices]
    await settle()
    waiting[0].cancel()
    await settle()
    assert not stream.closed  # the other choice still waits for its beam
    waiting[1].cancel()
    await settle()
    assert stream.closed
