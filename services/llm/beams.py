"""Beam search: one backend request per prompt yields all its beams, and its `n` choices are the `n` best.

Until the search ends the backend may rewrite a beam's earlier tokens or reorder the beams, so nothing of
a beam is final before the request's last step. `BeamSearch` reads the request to its end and gives each
choice one token step, its beam: every choice then runs through the same `Completion` (stop words and
strings, detokenization, counts) as a sampled one. Streamed, a choice's text therefore comes in one piece
when the search ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

from services.llm.backends import Step


class BeamSearch:
    """One prompt's backend request, shared by its choices; the request starts when a choice first asks for
    its beam and is cancelled when every choice has gone."""

    def __init__(self, stream: AsyncGenerator[Step, None], choices: int) -> None:
        self.stream = stream
        self.waiting = choices  # choices that have not finished with the search
        self.task: asyncio.Task[Step] | None = None

    async def _last_beams(self) -> Step:
        """The search's last beams, and the prompt tokens the backend took from its cache, where it says."""
        last = Step(beams=[])
        async with contextlib.aclosing(self.stream) as steps:
            async for step in steps:
                last = Step(beams=step.beams if step.beams is not None else last.beams,
                            cached_tokens=step.cached_tokens if step.cached_tokens is not None else last.cached_tokens)
        return last

    async def choice(self, rank: int) -> AsyncGenerator[Step, None]:
        """Beam `rank` (0: the best) as one token step, once the search has ended; nothing when the
        backend returned fewer beams."""
        try:
            if self.task is None:
                self.task = asyncio.ensure_future(self._last_beams())
            last = await asyncio.shield(self.task)
            beams = last.beams or []
            if rank < len(beams):
                yield Step(token_ids=beams[rank], cached_tokens=last.cached_tokens)
        finally:
            self.waiting -= 1
            if self.waiting == 0 and self.task is not None and not self.task.done():
                self.task.cancel()  # closes the backend stream: Triton cancels the request
