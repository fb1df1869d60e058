"""The SSE helper as an ASGI app: keep-alive comments, errors after the headers, [DONE], disconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from edge.errors import OpenAIError
from edge.sse import DONE, data_event, sse_response
from edge.streaming import ChunkFraming
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

SCOPE = {"type": "http", "method": "POST", "path": "/", "headers": [], "asgi": {"spec_version": "2.4"}}


async def serve(events: AsyncGenerator[bytes, None], keepalive_s: float = 10.0, disconnect_after: float | None = None,
                messages: list[dict[str, Any]] | None = None) -> tuple[int, bytes]:
    """The status and the body written; every ASGI message sent lands in `messages`."""
    messages = [] if messages is None else messages

    async def receive() -> dict[str, Any]:
        if disconnect_after is None:
            await asyncio.Event().wait()
        await asyncio.sleep(disconnect_after or 0)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await asyncio.wait_for(sse_response(events, keepalive_s)(SCOPE, receive, send), 5)
    status = next(m["status"] for m in messages if m["type"] == "http.response.start")
    return status, b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")


async def test_the_stream_is_event_stream_that_no_cache_or_proxy_holds_back() -> None:
    async def one() -> AsyncGenerator[bytes, None]:
        yield data_event({"n": 1})

    messages: list[dict[str, Any]] = []
    status, body = await serve(one(), messages=messages)
    headers = dict(messages[0]["headers"])
    assert status == 200 and body == data_event({"n": 1}) + DONE
    assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
    assert headers[b"cache-control"] == b"no-cache" and headers[b"x-accel-buffering"] == b"no"
    assert b"content-length" not in headers
    assert messages[-1] == {"type": "http.response.body", "body": DONE, "more_body": False}


async def test_keep_alive_comments_fill_long_silences() -> None:
    async def slow() -> AsyncGenerator[bytes, None]:
        await asyncio.sleep(0.35)
        yield data_event({"n": 1})

    status, body = await serve(slow(), keepalive_s=0.1)
    assert status == 200
    assert body.count(b": keep-alive\n\n") >= 2
    assert body.endswith(b'data: {"n":1}\n\n' + DONE)


async def test_an_error_after_the_headers_is_an_error_event_then_done() -> None:
    async def failing() -> AsyncGenerator[bytes, None]:
        yield data_event({"n": 1})
        raise OpenAIError(503, "The llm service is unavailable; try again shortly.", code="service_unavailable")

    status, body = await serve(failing())
    events = body.decode().split("\n\n")
    assert status == 200 and events[0] == 'data: {"n":1}'
    assert events[1].startswith("event: error\ndata: ")
    error = json.loads(events[1].split("data: ", 1)[1])
    assert error == {"error": {"message": "The llm service is unavailable; try again shortly.",
                               "type": "server_error", "param": None, "code": "service_unavailable"}}
    assert events[2] == "data: [DONE]" and events[3:] == [""]


async def test_an_unexpected_failure_says_nothing_about_its_insides() -> None:
    async def broken() -> AsyncGenerator[bytes, None]:
        raise KeyError("secret internals")
        yield b""  # pragma: no cover

    _, body = await serve(broken())
    assert b"secret" not in body and b"Traceback" not in body
    assert b'"type":"server_error"' in body and body.endswith(DONE)


async def test_a_disconnect_cancels_the_event_generator() -> None:
    cancelled = asyncio.Event()

    async def endless() -> AsyncGenerator[bytes, None]:
        try:
            yield data_event({"n": 1})
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    _, body = await serve(endless(), disconnect_after=0.1)
    assert cancelled.is_set() and DONE not in body


class _TextShape:
    def opening(self, index: int) -> None:
        return None

    def delta(self, delta: llm_pb2.Delta) -> dict[str, Any]:
        return {"index": delta.index, "text": delta.text, "logprobs": None, "finish_reason": None}

    def end(self, index: int, reason: str) -> dict[str, Any]:
        return {"index": index, "text": "", "logprobs": None, "finish_reason": reason}


async def test_chunks_written_around_the_serialised_head_are_the_json_of_the_whole_chunk() -> None:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    choices = [_TextShape().delta(llm_pb2.Delta(index=0, text='Hi "there" é')), _TextShape().end(0, "stop")]
    for include_usage, extra in ((False, {}), (True, {"usage": None})):
        framing = ChunkFraming(_TextShape(), head, include_usage)  # type: ignore[arg-type]
        chunks = [*framing.start(llm_pb2.Accepted(choices=1)),
                  *framing.delta(llm_pb2.Delta(index=0, text='Hi "there" é')), *framing.end(0, "stop"),
                  *framing.finish(common_pb2.Usage(prompt_tokens=1, completion_tokens=1, total_tokens=2))]
        assert chunks[:2] == [data_event({**head, "choices": [choice], **extra}) for choice in choices]
        assert len(chunks) == (3 if include_usage else 2)


async def test_text_chunks_from_the_template_are_the_shapes_own_chunks() -> None:
    from edge.endpoints.chat import ChatShape
    from edge.endpoints.completions import CompletionShape

    head = {"id": "x-1", "object": "chunk", "created": 1, "model": "m"}
    texts = ["Hi", ' "quoted" \\ é\n', "\0", "\u2028 🦊", ""]
    for shape in (CompletionShape(False), ChatShape(False), ChatShape(False, reasoning_field="reasoning")):
        framing = ChunkFraming(shape, head, include_usage=True)  # type: ignore[arg-type]
        for index in (0, 3):
            for text in texts:
                delta = llm_pb2.Delta(index=index, text=text)
                expected = data_event({**head, "choices": [shape.delta(delta)], "usage": None})
                assert [*framing.delta(delta)] == [expected]
                assert json.loads(expected[6:])["choices"][0]["index"] == index
