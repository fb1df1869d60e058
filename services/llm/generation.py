"""One completion's text as its tokens stream in, and the merging of concurrent completions.

Per token: token-id stop words (end id included) are matched and dropped, the rest is detokenized
(whole characters only), then stop strings are matched on the text and cut. Log probabilities follow
their tokens: a token's entry goes out with the first text at or after its start, and is dropped when a
stop string cuts the text before it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from services.llm.detokenizer import Decode, Detokenizer, TokenText
from services.llm.stops import StopStrings, StopTokens
from tritongate.llm.v1 import llm_pb2


@dataclass
class _Entry:
    token: int
    logprob: float
    start: int  # text offset where the token's text begins


class Completion:
    """One choice: feed it tokens, take Delta messages."""

    def __init__(self, index: int, prompt: Sequence[int], max_new: int, stop_words: list[list[int]],
                 stops: list[str], decode: Decode, token_text: TokenText, echo: str = "") -> None:
        self.index = index
        self.max_new = max_new
        self.tokens = StopTokens(stop_words)
        self.detokenizer = Detokenizer(decode, prompt)
        self.strings = StopStrings(stops)
        self.token_text = token_text
        self.echo = echo
        self.decoded = len(echo)  # characters decoded so far (echo included), before stop strings
        self.emitted = len(echo)  # characters sent so far
        self.entries: deque[_Entry] = deque()
        self.logprobs: deque[float] = deque()

    @property
    def consumed(self) -> int:
        """Generated tokens used, up to the one that ended the completion."""
        return self.tokens.consumed

    @property
    def stopped(self) -> bool:
        return self.tokens.stopped or self.strings.stopped

    @property
    def done(self) -> bool:
        return self.stopped or self.consumed >= self.max_new

    def start(self) -> llm_pb2.Delta | None:
        """The echoed prompt, if any, as the first increment."""
        return llm_pb2.Delta(index=self.index, text=self.echo) if self.echo else None

    def feed(self, tokens: Sequence[int], logprobs: Sequence[float] | None = None) -> llm_pb2.Delta | None:
        """The increment these tokens make (None when they make no text yet)."""
        pieces = []
        for i, token in enumerate(tokens):
            if self.done:
                break
            released = self.tokens.feed((token,))
            if logprobs is not None:
                self.logprobs.append(logprobs[i])
            pieces += [self._decode(t) for t in released]
            if self.tokens.stopped:
                self.logprobs.clear()  # the stop word's
            if self.strings.stopped:
                break
        return self._delta("".join(pieces))

    def finish(self) -> llm_pb2.Delta:
        """The last increment, with the finish reason."""
        text = ""
        if not self.stopped:
            text = "".join(self._decode(t) for t in self.tokens.flush())
            text += self.strings.feed(self.detokenizer.flush())
            if not self.strings.stopped:
                text += self.strings.flush()
        self.emitted += len(text)
        reason = "stop" if self.stopped or self.consumed < self.max_new else "length"
        return llm_pb2.Delta(index=self.index, text=text, finish_reason=reason, logprobs=self._logprobs(final=True))

    def _decode(self, token: int) -> str:
        start = self.decoded
        if self.logprobs:
            self.entries.append(_Entry(token, self.logprobs.popleft(), start))
        piece = self.detokenizer.add(token)
        self.decoded += len(piece)
        return self.strings.feed(piece)

    def _delta(self, text: str) -> llm_pb2.Delta | None:
        self.emitted += len(text)
        logprobs = self._logprobs(final=False)
        return llm_pb2.Delta(index=self.index, text=text, logprobs=logprobs) if text or logprobs else None

    def _logprobs(self, final: bool) -> list[llm_pb2.TokenLogprob]:
        """Entries of tokens whose text has begun to go out; at the end, all that a stop string left."""
        ready = []
        while self.entries and (self.entries[0].start < self.emitted or (final and not self.strings.stopped)):
            entry = self.entries.popleft()
            ready.append(llm_pb2.TokenLogprob(token=self.token_text.text(entry.token), logprob=entry.logprob,
                                              bytes=self.token_text.bytes(entry.token), text_offset=entry.start))
        if final:
            self.entries.clear()
        return ready


T = TypeVar("T")


async def merge(streams: Sequence[AsyncGenerator[T, None]]) -> AsyncIterator[T]:
    """Items of concurrent streams as they come; the first failure cancels the rest."""
    if len(streams) == 1:
        async with contextlib.aclosing(streams[0]) as only:
            async for item in only:
                yield item
        return
    queue: asyncio.Queue[tuple[T] | BaseException | None] = asyncio.Queue()  # (item,) | failure | end

    async def pump(stream: AsyncGenerator[T, None]) -> None:
        try:
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    await queue.put((item,))
        except Exception as exc:
            await queue.put(exc)
        else:
            await queue.put(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            message = await queue.get()
            if isinstance(message, BaseException):
                raise message
            if message is None:
                running -= 1
            else:
                yield message[0]
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
