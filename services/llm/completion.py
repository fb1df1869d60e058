"""One completion's text as its steps stream in, and the merging of concurrent completions.

Token steps, per token: token-id stop words (end id included) are matched and dropped, the rest is
detokenized (whole characters only), then stop strings are matched on the text and cut. Text steps
(backends that detokenize themselves) go straight to the stop-string matcher, which the service applies
whatever the backend did (a backend that already cut a stop string leaves nothing for it to find).
Log probabilities follow their tokens: a token's entry goes out with the first text at or after its
start, and is dropped when a stop string cuts the text before it. With the prompt's log probabilities
(`echo` with `logprobs`), the echo waits for the first step, which brings them, and goes out with one
entry per prompt token (the first without a log probability); `max_tokens` 0 then keeps nothing of what
the backend generated. Such a request scores a text (lm-evaluation-harness sends `max_tokens` 1 and drops
the last entry as the generated token's), so every generated token keeps its entry, the end id's too, as
vLLM returns them.

A token step counts its tokens; a text step counts what the backend says it holds, or, when the backend
says nothing, what the model's tokenizer makes of the text (at least one token per response with text).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from services.llm.backends import FinishReason, PromptLogprob, Step
from services.llm.detokenizer import Detokenizer, TokenDecoding
from services.llm.stops import StopStrings, StopTokens
from tritongate.llm.v1 import llm_pb2


@dataclass
class _Entry:
    token: int
    logprob: float | None  # None: the prompt's first token
    start: int  # text offset where the token's text begins
    top: list[tuple[int, float]] = field(default_factory=list)  # alternatives, most likely first


@dataclass
class _TextCount:
    """Tokens behind text steps: the backend's counts where it gives them, else estimated."""

    reported: int = 0
    any_reported: bool = False
    steps: int = 0  # uncounted steps that brought text
    received: list[str] = field(default_factory=list)  # text as it came (before stop strings)

    def add(self, step: Step) -> None:
        self.received.append(step.text or "")
        if step.tokens is not None:
            self.reported += step.tokens
            self.any_reported = True
        elif step.text:
            self.steps += 1


@dataclass(frozen=True)
class CompletionRules:
    """What every completion of one request is held to, decided once per request: the token-id stop words
    (the end id unless ignored, `model_infos` `stop_words`), the stop strings, how the model's tokens become
    text, and vLLM's `min_tokens`, `include_stop_str_in_output` and `skip_special_tokens`."""

    stop_words: list[list[int]]
    stops: list[str]
    decoding: TokenDecoding
    min_tokens: int = 0
    include_stop: bool = False
    skip_special_tokens: bool = True


class Completion:
    """One choice's text: feed it steps, take Delta messages."""

    def __init__(self, index: int, prompt: Sequence[int], rules: CompletionRules, *, max_new: int,
                 echo: str = "", prompt_logprobs: bool = False) -> None:
        self.index = index
        self.max_new = max_new
        self.min_tokens = rules.min_tokens
        self.tokens = StopTokens(rules.stop_words, rules.min_tokens)
        decoding = rules.decoding
        self.detokenizer = Detokenizer(decoding.decode if rules.skip_special_tokens else decoding.decode_special,
                                       prompt)
        self.strings = StopStrings(rules.stops, include=rules.include_stop)
        self.token_text = decoding.token_text
        self.count = decoding.count
        self.echo = echo
        self.decode_special = decoding.decode_special
        self.echo_pending = prompt_logprobs  # the echo goes out with the prompt's log probabilities
        self.scoring = prompt_logprobs  # every generated token's entry is kept (the module's docstring)
        self.decoded = len(echo)  # characters decoded so far (echo included), before stop strings
        self.emitted = len(echo)  # characters sent so far
        self.entries: deque[_Entry] = deque()
        self.logprobs: deque[_Entry] = deque()  # of fed tokens not decoded yet (start unknown: 0)
        self.text: _TextCount | None = None  # set by the first text step
        self.reason: FinishReason | None = None  # the backend's, when it says
        self.prompt_tokens: int | None = None  # the prompt's tokens as the backend counted them
        self.cached_tokens: int | None = None  # of them, those the backend took from its cache, where it says
        self.armed = rules.min_tokens == 0
        # The text of each token the last step (or the finish) released, in order: what each token added to
        # the delta's text. None after a text step, which brings text without its tokens.
        self.released: list[str] | None = []

    @property
    def consumed(self) -> int:
        """Generated tokens used, up to the one that ended the completion."""
        if self.text is None:
            return self.tokens.consumed
        count = self.text
        if count.any_reported:
            return count.reported
        received = "".join(count.received)
        return max(self.count(received[: self.strings.end] if self.strings.stopped else received), count.steps)

    @property
    def stopped(self) -> bool:
        return self.tokens.stopped or self.strings.stopped

    @property
    def done(self) -> bool:
        """Nothing more to take: a stop, or (token steps) the token limit. Text backends end by themselves."""
        return self.stopped or (self.text is None and self.consumed >= self.max_new)

    def start(self) -> llm_pb2.Delta | None:
        """The echoed prompt, if any, as the first increment (unless it waits for its log probabilities)."""
        return llm_pb2.Delta(index=self.index, text=self.echo) if self.echo and not self.echo_pending else None

    def add(self, step: Step) -> llm_pb2.Delta | None:
        """The increment a backend step makes (None when it makes no text yet)."""
        if step.cached_tokens is not None:
            self.cached_tokens = step.cached_tokens
        echo = self._echo(step.prompt_logprobs) if self.echo_pending and step.prompt_logprobs is not None else None
        if self.max_new == 0:  # generated only to get the prompt's log probabilities
            return echo
        if step.text is None:
            delta = self.feed(step.token_ids, step.logprobs, step.top_logprobs)
        else:
            delta = self._feed_text(step)
        if echo is None or delta is None:
            return echo or delta
        echo.text += delta.text
        echo.logprobs.extend(delta.logprobs)
        return echo

    def feed(self, tokens: Sequence[int], logprobs: Sequence[float] | None = None,
             tops: Sequence[list[tuple[int, float]]] | None = None) -> llm_pb2.Delta | None:
        """The increment these tokens make (None when they make no text yet)."""
        pieces = []
        for i, token in enumerate(tokens):
            if self.done:
                break
            released = self.tokens.feed((token,))
            if logprobs is not None:
                top = tops[i] if tops is not None and i < len(tops) else []
                self.logprobs.append(_Entry(token, logprobs[i], 0, top))
            pieces += [self._decode(t) for t in released]
            if self.tokens.stopped:
                if self.scoring:  # the stop word's, at the end of the text
                    self.entries.extend(replace(entry, start=self.decoded) for entry in self.logprobs)
                self.logprobs.clear()
            if self.strings.stopped:
                break
        self.released = pieces
        return self._delta("".join(pieces))

    def finish(self) -> llm_pb2.Delta:
        """The last increment, with the finish reason."""
        text = ""
        self.released = [] if self.text is None else None
        if not self.strings.stopped:  # what was held back did not become a stop string: it goes out
            if self.text is None:
                if not self.tokens.stopped:
                    self.released = [self._decode(t) for t in self.tokens.flush()]
                    text = "".join(self.released)
                text += self.strings.feed(self.detokenizer.flush(), self._armed())
            if not self.strings.stopped:
                text += self.strings.flush()
        self.emitted += len(text)
        if self.echo_pending:  # the backend never sent the prompt's log probabilities (emitted counts the echo)
            self.echo_pending, text = False, self.echo + text
        return llm_pb2.Delta(index=self.index, text=text, finish_reason=self._finish_reason(),
                             logprobs=self._logprobs(final=True), stop_string=self.strings.matched)

    def _finish_reason(self) -> FinishReason:
        if self.stopped:
            return "stop"
        if self.text is not None and self.reason is not None:
            return self.reason
        return "stop" if self.consumed < self.max_new else "length"

    def _decode(self, token: int) -> str:
        start = self.decoded
        if self.logprobs:
            self.entries.append(replace(self.logprobs.popleft(), start=start))
        piece = self.detokenizer.add(token)
        self.decoded += len(piece)
        return self.strings.feed(piece, self._armed())

    def _echo(self, prompt: list[PromptLogprob]) -> llm_pb2.Delta:
        """The echo with an entry per prompt token, each at the offset where its text starts in the echo."""
        self.echo_pending = False
        detokenizer, offset, entries = Detokenizer(self.decode_special), 0, []
        for position in prompt:
            entries.append(_Entry(position.token, position.logprob, min(offset, len(self.echo)), position.top))
            offset += len(detokenizer.add(position.token))
        return llm_pb2.Delta(index=self.index, text=self.echo, logprobs=[self._entry(e) for e in entries])

    def _armed(self) -> bool:
        """Whether stop strings may end the completion yet (min_tokens reached); counted until they may."""
        self.armed = self.armed or self.consumed >= self.min_tokens
        return self.armed

    def _feed_text(self, step: Step) -> llm_pb2.Delta | None:
        count = self.text = self.text or _TextCount()
        self.released = None
        if step.prompt_tokens is not None:
            self.prompt_tokens = step.prompt_tokens
        self.reason = step.finish_reason or self.reason
        if self.strings.stopped:
            return None
        count.add(step)
        text = step.text or ""
        if step.logprobs is not None:
            self._text_entries(step, text)
        self.decoded += len(text)
        return self._delta(self.strings.feed(text, self._armed()))

    def _text_entries(self, step: Step, text: str) -> None:
        """Entries for the tokens behind a text step, each starting where its own text would (within the step)."""
        offset = 0
        tops = step.top_logprobs or []
        for i, (token, logprob) in enumerate(zip(step.token_ids, step.logprobs or [], strict=False)):
            self.entries.append(_Entry(token, logprob, self.decoded + min(offset, len(text)),
                                       tops[i] if i < len(tops) else []))
            offset += len(self.token_text.text(token))

    def _delta(self, text: str) -> llm_pb2.Delta | None:
        self.emitted += len(text)
        logprobs = self._logprobs(final=False)
        return llm_pb2.Delta(index=self.index, text=text, logprobs=logprobs) if text or logprobs else None

    def _logprobs(self, final: bool) -> list[llm_pb2.TokenLogprob]:
        """Entries of tokens whose text has begun to go out; at the end, all that a stop string left (for
        text steps: those with text)."""
        ready = []
        rest = final and not self.strings.stopped and (self.text is None or self.scoring)
        while self.entries and (self.entries[0].start < self.emitted or rest):
            ready.append(self._entry(self.entries.popleft()))
        if final:
            self.entries.clear()
        return ready

    def _entry(self, entry: _Entry) -> llm_pb2.TokenLogprob:
        text = self.token_text
        return llm_pb2.TokenLogprob(
            token=text.text(entry.token), logprob=entry.logprob, bytes=text.bytes(entry.token),
            text_offset=entry.start,
            top_logprobs=[llm_pb2.TopLogprob(token=text.text(t), logprob=value, bytes=text.bytes(t))
                          for t, value in entry.top])


T = TypeVar("T")

# Turns of the event loop a batch stays open after its first item. On an idle service a turn takes
# microseconds; on a busy one it is long, and what the streams produce meanwhile goes in the same message
# (at 64 echo streams on 2 cores, about 0.6 messages per token instead of 1.03).
JOIN_TURNS = 4
# The default least time between two batches (a model's `stream_interval_ms`; the first batch leaves at once:
# the time to first token is untouched). A lone fast stream (one token every 0.3 ms from an echo model)
# otherwise sends a message per token, and each message costs the service, the edge and the client their own
# wake-ups; at most a thousand messages a second per generation, with the tokens of a millisecond in each, is
# invisible to a reader.
MIN_INTERVAL_S = 0.001


def _turns(n: int) -> asyncio.Future[None]:
    """Done after `n` turns of the loop. A chain of callbacks: `asyncio.sleep(0)` n times would resume the
    waiting task (and every coroutine frame it awaits through, the whole RPC handler's) at every turn."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def tick(left: int) -> None:
        if left > 1:
            loop.call_soon(tick, left - 1)
        elif not done.done():
            done.set_result(None)

    loop.call_soon(tick, n)
    return done


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


async def _window(wait: float, ended: asyncio.Future[None]) -> None:
    """The time a batch stays open after its first item: `JOIN_TURNS` turns of the loop once `wait` (what is
    left of the least interval between batches) is over or a stream has ended; else as asyncio.sleep(wait),
    cut short by a stream's end."""
    if wait <= 0 or ended.done():
        await _turns(JOIN_TURNS)
        return
    timer = asyncio.get_running_loop().call_later(wait, _resolve, ended)
    try:
        await ended
    finally:
        timer.cancel()


async def merge(streams: Sequence[AsyncGenerator[T, None]], min_interval_s: float = MIN_INTERVAL_S
                ) -> AsyncIterator[list[T]]:
    """Items of concurrent streams, in batches: everything that arrived while the consumer was busy, or
    within `JOIN_TURNS` turns of the loop after the batch's first item, or until `min_interval_s` after the
    previous batch left, comes together; a stream's end cuts that wait short (its last item, a completion's
    finish, is not held back). The first failure cancels the rest."""
    queue: asyncio.Queue[tuple[T] | BaseException | None] = asyncio.Queue()  # (item,) | failure | end
    loop = asyncio.get_running_loop()
    ended = loop.create_future()  # done once a stream has ended since the last batch was drained

    def end(marker: BaseException | None) -> None:
        queue.put_nowait(marker)
        _resolve(ended)

    async def pump(stream: AsyncGenerator[T, None]) -> None:
        try:
            async with contextlib.aclosing(stream) as items:
                async for item in items:
                    queue.put_nowait((item,))
        except Exception as exc:
            end(exc)
        else:
            end(None)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        running = len(tasks)
        left = float("-inf")  # when the last batch left
        while running:
            batch, failure = [], None
            message = await queue.get()
            await _window(left + min_interval_s - loop.time(), ended)
            ended = loop.create_future()  # the ends queued so far are drained below
            while True:
                if isinstance(message, BaseException):
                    failure = message
                    break
                if message is None:
                    running -= 1
                else:
                    batch.append(message[0])
                if queue.empty():
                    break
                message = queue.get_nowait()
            if batch:
                yield batch  # what came before a failure still goes out
                left = loop.time()
            if failure is not None:
                raise failure
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
        into.reasoning += delta.reasoning
        into.logprobs.extend(delta.logprobs)
        for piece in delta.tool_calls:  # a call's arguments joined, as its text is
            last = into.tool_calls[-1] if into.tool_calls else None
            if last is not None and last.index == piece.index and not piece.id:
                last.arguments += piece.arguments
            else:
                into.tool_calls.append(piece)
        if delta.finish_reason:
            into.finish_reason = delta.finish_reason
            into.stop_string = delta.stop_string
    return list(merged.values())
