"""The one Server-Sent Events helper, OpenAI's flavour: `data: {json}` events, a `: keep-alive` comment
when nothing was sent for a while, an `error` event when something fails after the headers went out
(the status can no longer change; an endpoint may write its own failure event instead, as the Responses
API's `response.failed`), and `data: [DONE]` at the end, error or not.

A client that disconnects cancels the event generator, and with it the gRPC call it is reading, which
cancels the Triton request. On shutdown, streams in flight finish while uvicorn drains (up to its
graceful-shutdown timeout), like every other request.

`EventStream` is written here rather than taken from sse-starlette: the per-event path is the edge's
per-token path, and sse-starlette pays an anyio cancel scope and a task group's bookkeeping on every
event. Here each item of the iterator is one `send` (edge/streaming.py joins the events of one service
message into one item).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from edge.errors import OpenAIError, as_openai_error
from edge.lean import cancelled_on_disconnect

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
_HEADERS = {"Cache-Control": "no-cache", "Connection": "keep-alive", "X-Accel-Buffering": "no"}  # no proxy buffering


def data_event(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_event(error: OpenAIError, path: str = "") -> bytes:
    """The error body (OpenAI's, or Anthropic's on its routes) as an `error` event (the openai SDK raises it
    as APIError, the anthropic SDK as the error of its status)."""
    return b"event: error\ndata: " + orjson.dumps(error.body(path)) + b"\n\n"


FailureEvent = Callable[[OpenAIError, str], bytes]  # the event that ends a failed stream to a path


class EventStream(Response):
    """Streams `events` (already encoded), then `done` (`[DONE]`; Anthropic's streams end without it); a
    failure is written by `failed` before it."""

    def __init__(self, events: AsyncGenerator[bytes, None], keepalive_s: float,
                 to_error: Callable[[Exception], OpenAIError], done: bytes = DONE,
                 failed: FailureEvent = error_event) -> None:
        self.status_code, self.media_type, self.background = 200, "text/event-stream", None
        self.init_headers(_HEADERS)  # as StreamingResponse: no Content-Length
        self.events = events
        self.keepalive_s = keepalive_s
        self.to_error = to_error
        self.done = done
        self.failed = failed
        self.sent = 0  # writes so far: the keep-alive timer's sign of life
        self.ended = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        with cancelled_on_disconnect(receive) as disconnected:
            keepalive = asyncio.ensure_future(self._keepalive(send))
            try:
                last = self.done
                try:
                    async with contextlib.aclosing(self.events) as events:
                        async for event in events:
                            await send({"type": "http.response.body", "body": event, "more_body": True})
                            self.sent += 1
                except Exception as exc:  # cancellation (the client gone) is not an Exception and propagates
                    last = self.failed(self.to_error(exc), scope["path"]) + self.done
                self.ended = True
                await send({"type": "http.response.body", "body": last, "more_body": False})
            except asyncio.CancelledError:
                if not disconnected():
                    raise  # not the client's disconnect: e.g. the server shutting down
                # the client is gone: nobody to answer
            finally:
                keepalive.cancel()

    async def _keepalive(self, send: Send) -> None:
        seen = self.sent
        while True:
            await asyncio.sleep(self.keepalive_s)
            if self.sent == seen and not self.ended:
                await send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
            seen = self.sent


def sse_response(events: AsyncGenerator[bytes, None], keepalive_s: float,
                 to_error: Callable[[Exception], OpenAIError] = as_openai_error, done: bytes = DONE,
                 failed: FailureEvent = error_event) -> EventStream:
    """Stream `events` (already encoded), then `done`; a failure becomes an error event first (`failed`
    writes it: an `error` event unless the endpoint has its own)."""
    return EventStream(events, keepalive_s, to_error, done, failed)
