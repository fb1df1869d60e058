"""The one Server-Sent Events helper, OpenAI's flavour: `data: {json}` events, a `: keep-alive` comment
when nothing was sent for a while, an `error` event when something fails after the headers went out
(the status can no longer change), and `data: [DONE]` at the end, error or not.

A client that disconnects cancels the event generator (sse-starlette watches for `http.disconnect`),
and with it the gRPC call it is reading, which cancels the Triton request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
from sse_starlette import EventSourceResponse, ServerSentEvent
from sse_starlette.sse import AppStatus

from edge.errors import OpenAIError, as_openai_error

# On SIGTERM, sse-starlette would cut every stream at once; instead streams in flight finish while
# uvicorn drains (up to its graceful-shutdown timeout), like every other request.
AppStatus.disable_automatic_graceful_drain()

DONE = b"data: [DONE]\n\n"


def data_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def error_event(error: OpenAIError) -> bytes:
    """The OpenAI error body as an `error` event (the openai SDK raises it as APIError)."""
    return b"event: error\ndata: " + orjson.dumps(error.body()) + b"\n\n"


def _keepalive() -> ServerSentEvent:
    return ServerSentEvent(comment="keep-alive", sep="\n")


async def _terminated(events: AsyncIterator[bytes], to_error: Callable[[Exception], OpenAIError]
                      ) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            yield event
    except Exception as exc:  # cancellation (client gone) is not an Exception and propagates
        yield error_event(to_error(exc))
    yield DONE


def sse_response(events: AsyncIterator[bytes], keepalive_s: float,
                 to_error: Callable[[Exception], OpenAIError] = as_openai_error) -> EventSourceResponse:
    """Stream `events` (already encoded), then `[DONE]`; a failure becomes an error event first."""
    return EventSourceResponse(_terminated(events, to_error), ping=keepalive_s, sep="\n",
                               ping_message_factory=_keepalive, headers={"Cache-Control": "no-cache"})
