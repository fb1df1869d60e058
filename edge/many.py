"""The edge's GenerateMany streams to the llm service (services/llm/servicer.py `ManyGenerations`): a
generation starts with a message on a stream already open instead of a call of its own, and the service
sends what its generations have ready at the same moment in one message.

An edge process keeps `count` streams open and starts generations on them in turn. A stream is retired
(it takes no new generation, and closes once its last one ends) after `STREAM_AGE_S` or `STREAM_STARTS`
generations, whichever comes first, so that new streams are opened on the channel's current connections, as
new calls would be: the channel's round_robin puts each new stream on the next replica, so generations
spread over every replica (more than the edge's streams, too) within a few dozen, and streams follow
replicas as they come and go (DNS) and connections that reach the service's maximum age. A generation that
fails with UNAVAILABLE before it was accepted (its stream broke or was closed, or the service is shutting
down) starts once more, on the next stream in turn (a new one where that was retired), as a new call would
go to the next replica.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from edge.errors import OpenAIError
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

log = logging.getLogger(__name__)

STREAM_AGE_S = 10.0  # well inside the services' connection age (30 s), so streams move with the connections
STREAM_STARTS = 32  # a new stream costs what one Generate call does: a thirty-second of that per generation

_UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


class ManyGeneration:
    """One generation on a GenerateMany stream: its messages, as a Generate call of its own would give
    them (`next()`: a message, None after the usage, an OpenAIError on failure)."""

    __slots__ = ("_handle", "_waiter", "accepted", "context", "ended", "events", "id", "request", "retried", "stream",
                 "streams")

    def __init__(self, streams: GenerateStreams, request: llm_pb2.GenerateRequest,
                 context: common_pb2.ItemContext) -> None:
        self.streams, self.request, self.context = streams, request, context
        self.events: deque[llm_pb2.GenerateEvent | OpenAIError] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self.accepted = self.ended = self.retried = False
        self.stream, self.id = streams.start(self)
        # The service keeps the deadline (services/common/items.py) and ends the generation with its own
        # DEADLINE_EXCEEDED. This guard, a second later, is the half of a call's deadline that gRPC keeps on
        # the caller's side: the stream has no deadline (it outlives its generations), so without it nothing
        # would end a generation whose service cannot answer (its event loop stuck, its connection silent).
        self._handle = asyncio.get_running_loop().call_later(context.timeout_s + 1.0, self._expire) \
            if context.timeout_s else None

    def deliver(self, event: llm_pb2.GenerateEvent | OpenAIError) -> None:
        """From the stream: the generation's next event (a usage or a failure is its last)."""
        if isinstance(event, OpenAIError) or event.HasField("failure") or event.response.HasField("usage"):
            self.stream.forget(self.id)
        self.events.append(event)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next(self) -> llm_pb2.GenerateResponse | None:
        while not self.events:
            if self.ended:
                return None
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        event = self.events.popleft()
        if isinstance(event, OpenAIError) or event.HasField("failure"):
            error = event if isinstance(event, OpenAIError) else self.streams.item_failure(event.failure)
            if not self.accepted and not self.retried and self._unavailable(event):
                self.retried = True  # once, on the next stream (the one it was on is retired)
                self.stream.retire()
                self.stream, self.id = self.streams.start(self)
                return await self.next()
            self._end()
            raise error
        self.accepted = True
        if event.response.HasField("usage"):
            self._end()
        return event.response

    @staticmethod
    def _unavailable(event: llm_pb2.GenerateEvent | OpenAIError) -> bool:
        if isinstance(event, OpenAIError):
            return event.status == 503
        return event.failure.code == _UNAVAILABLE

    def cancel(self) -> None:
        """Stop the generation, unless it has ended (what every caller does when it is done with it)."""
        if not self.ended:
            self.stream.cancel(self.id)
            self._end()

    def _expire(self) -> None:
        self.stream.cancel(self.id)
        self.deliver(self.streams.status(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))

    def _end(self) -> None:
        self.ended = True
        if self._handle is not None:
            self._handle.cancel()


class _Stream:
    """One GenerateMany call and the generations in flight on it."""

    def __init__(self, streams: GenerateStreams) -> None:
        self.streams = streams
        self.outbox: asyncio.Queue[llm_pb2.GenerateCall | None] = asyncio.Queue()
        self.generations: dict[int, ManyGeneration] = {}
        self.started = 0  # generations it took; each one's id is its number among them
        self.opened = time.monotonic()
        self.retired = False
        # Opened in a context of its own: it serves many requests, so its span and its log lines are not those
        # of the request whose generation opened it (each generation carries its own: ItemContext).
        self.call, self.reader = contextvars.Context().run(self._open)

    def _open(self) -> tuple[Any, asyncio.Task[None]]:
        return self.streams.stub.GenerateMany(self._calls()), asyncio.create_task(self._read())

    async def _calls(self) -> AsyncIterator[llm_pb2.GenerateCall]:
        while (call := await self.outbox.get()) is not None:
            yield call

    def add(self, generation: ManyGeneration) -> int:
        id = self.started
        self.started += 1
        self.generations[id] = generation
        self.outbox.put_nowait(llm_pb2.GenerateCall(id=id, start=generation.request, context=generation.context))
        return id

    def cancel(self, id: int) -> None:
        if self.forget(id):
            self.outbox.put_nowait(llm_pb2.GenerateCall(id=id, cancel=True))

    def forget(self, id: int) -> bool:
        """The generation has ended; the stream closes once it was the last and the stream is retired."""
        found = self.generations.pop(id, None) is not None
        if found and self.retired and not self.generations:
            self.outbox.put_nowait(None)  # ends the calls: the service ends the stream
        return found

    def retire(self) -> None:
        if not self.retired:
            self.retired = True
            self.streams.retired(self)
            if not self.generations:
                self.outbox.put_nowait(None)

    async def _read(self) -> None:
        how, level = "closed by the service (draining)", logging.INFO
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:  # type: ignore[attr-defined]
                for event in message.events:
                    if (generation := self.generations.get(event.id)) is not None:
                        generation.deliver(event)
        except grpc.aio.AioRpcError as exc:
            how, level = f"broken ({exc.code().name}: {exc.details()})", logging.WARNING
        finally:
            self.retire()
            if self.generations:
                log.log(level, "a stream to the llm service was %s with %d generations on it", how,
                        len(self.generations))
            # A generation's own failure comes as its own event; a stream that breaks (whatever gRPC's code:
            # a killed service's connection can end in INTERNAL "Internal error from Core") or that the
            # service closes (draining) means the service is unavailable to the generations on it: a 503,
            # and those not yet accepted start once more on the next stream.
            for generation in list(self.generations.values()):  # each its own error: its endpoint renames `param`
                generation.deliver(self.streams.status(grpc.StatusCode.UNAVAILABLE))


class GenerateStreams:
    """An edge process's GenerateMany streams to the llm service."""

    def __init__(self, stub: Any, count: int, item_failure: Callable[[common_pb2.ItemError], OpenAIError]) -> None:
        self.stub = stub
        self.item_failure = item_failure  # the client's mapping of a service's status to an HTTP error
        self.open: list[_Stream | None] = [None] * count
        self.turn = itertools.cycle(range(count))
        self.draining: set[_Stream] = set()  # retired, until their last generation ends

    def status(self, code: grpc.StatusCode, message: str = "") -> OpenAIError:
        """The client's error for a status the edge itself gives a generation (as the service would have)."""
        return self.item_failure(common_pb2.ItemError(code=code.value[0], message=message))

    def start(self, generation: ManyGeneration) -> tuple[_Stream, int]:
        """Put `generation` on the next stream in turn (a new one where that is retired, too old or full)."""
        slot = next(self.turn)
        stream = self.open[slot]
        if stream is None or stream.retired or stream.started >= STREAM_STARTS or \
                time.monotonic() - stream.opened > STREAM_AGE_S:
            if stream is not None:
                stream.retire()
            stream = self.open[slot] = _Stream(self)
        return stream, stream.add(generation)

    def retired(self, stream: _Stream) -> None:
        self.draining.add(stream)
        stream.reader.add_done_callback(lambda _: self.draining.discard(stream))

    async def close(self) -> None:
        streams = {s for s in (*self.open, *self.draining) if s is not None}
        for stream in streams:
            stream.call.cancel()
        await asyncio.gather(*(stream.reader for stream in streams), return_exceptions=True)
