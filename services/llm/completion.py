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

from services.llm.detokenizer import Detokenizer, TokenDecoding
from services.llm.stops import StopStrings, StopTokens
from tritongate.llm.v1 import llm_pb2


@dataclass
class _Entry:
    token: int
    logprob: float
    start: int  # text offset where the token's text begins


class Completion:
    """One choice: feed it tokens, take Delta messages."""

    def __init__(self, index: int, prompt: Sequence[int], *, max_new: int, stop_words: list[list[int]],
                 stops: list[str], decoding: TokenDecoding, echo: str = "") -> None:
        self.index = index
        self.max_new = max_new
        self.tokens = StopTokens(stop_words)
        self.detokenizer = Detokenizer(decoding.decode, prompt)
        self.strings = StopStrings(stops)
        self.token_text = decoding.token_text
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
        if not self.strings.stopped:  # what was held back did not become a stop string: it goes out
            if not self.tokens.stopped:
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


async def merge(streams: Sequence[AsyncGenerator[T, None]]) -> AsyncIterator[list[T]]:
    """Items of concurrent streams, in batches: everything that arrived while the consumer was busy
    comes together (at once when it is idle). The first failure cancels the rest."""
    queue: asyncio.Queue[tuple[T] | BaseException | None] = asyncio.Queue()  # (item,) | failure | end

    async def pump(stream: AsyncGenerator[T, None]) -> None:
        try:
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    queue.put_nowait((item,))
        except Exception as exc:
            queue.put_nowait(exc)
        else:
            queue.put_nowait(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        while running:
            batch = []
            message = await queue.get()
            while True:
                if isinstance(message, BaseException):
                    raise message
                if message is None:
                    running -= 1
                else:
                    batch.append(message[0])
                if queue.empty():
                    break
                message = queue.get_nowait()
            if batch:
                yield batch
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def coalesce(deltas: Sequence[llm_pb2.Delta]) -> list[llm_pb2.Delta]:
    """One delta per completion: consecutive increments joined (when the reader lags behind Triton,
    this is what keeps messages and HTTP writes from growing with the token rate)."""
    merged: dict[int, llm_pb2.Delta] = {}
    for delta in deltas:
        into = merged.get(delta.index)
        if into is None:
            merged[delta.index] = delta
            continue
        into.text += delta.text
        into.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            into.finish_reason = delta.finish_reason
    return list(merged.values())
