"""The one code path of chat and completions, streamed or not.

The Generate RPC starts; until the service's first message (`accepted`) any failure is an ordinary HTTP
error with the right status. Then either every delta becomes an SSE chunk (the endpoint's `Shape` says
how), or the deltas are collected into one response. A client that goes away cancels the RPC, which
cancels the Triton requests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import grpc
import orjson
from fastapi import Request, Response

from edge.cancel import until_disconnected
from edge.clients import Backend
from edge.errors import OpenAIError, from_grpc
from edge.metrics import TokenTimer, current
from edge.protocol.generation import Collected, Shape, usage_object
from edge.sse import data_event, sse_response
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import request_metadata

Call = Any  # grpc.aio.UnaryStreamCall[GenerateRequest, GenerateResponse]
EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


async def _next(call: Call, backend: Backend) -> llm_pb2.GenerateResponse | None:
    """The next message; None at the end of the stream; an OpenAIError on failure."""
    try:
        message = await call.read()
    except grpc.aio.AioRpcError as exc:
        raise from_grpc(exc, backend.name, backend.retry_after_s) from None
    return None if message is EOF else message


async def generate(request: Request, backend: Backend, proto: llm_pb2.GenerateRequest, shape: Shape, *,
                   stream: bool, include_usage: bool = False) -> Response:
    settings = request.app.state.settings
    proto.request_id = current().request_id  # the X-Request-ID: Triton's request ids are "<it>-<choice>"
    head = {"id": f"{shape.prefix}-{uuid.uuid4().hex}", "object": shape.object, "created": int(time.time()),
            "model": proto.model}
    call = backend.stub.Generate(proto, timeout=settings.request_timeout_s, metadata=request_metadata())
    try:
        first = await until_disconnected(request, _next(call, backend))
    except BaseException:
        call.cancel()
        raise
    if first is None or first.WhichOneof("event") != "accepted":
        call.cancel()
        raise OpenAIError(500, f"The {backend.name} service answered out of order; see its log.")
    if stream:
        events = _chunks(call, backend, first.accepted, shape, head, include_usage)
        return sse_response(events, settings.sse_keepalive_s)
    try:
        body = await until_disconnected(request, _collect(call, backend, first.accepted, shape, head))
    finally:
        call.cancel()
    return Response(orjson.dumps(body), media_type="application/json")


async def _deltas(call: Call, backend: Backend, usage: common_pb2.Usage) -> AsyncIterator[llm_pb2.Delta]:
    """The stream's deltas; the usage that closes it is copied into `usage` (and the access log)."""
    timer = TokenTimer(current().model)
    while (message := await _next(call, backend)) is not None:
        if message.WhichOneof("event") == "usage":
            usage.CopyFrom(message.usage)
            current().record_usage(message.usage, completion=True)
        else:
            timer.tick()
            yield message.delta


async def _chunks(call: Call, backend: Backend, accepted: llm_pb2.Accepted, shape: Shape, head: dict[str, Any],
                  include_usage: bool) -> AsyncIterator[bytes]:
    """Stream chunks: openings, one chunk per delta, an empty one with each finish reason, usage."""
    extra = {"usage": None} if include_usage else {}

    def chunk(choice: dict[str, Any]) -> bytes:
        return data_event({**head, "choices": [choice], **extra})

    try:
        for index in range(accepted.choices):
            opening = shape.opening(index)
            if opening is not None:
                yield chunk(opening)
        usage = common_pb2.Usage()
        async for delta in _deltas(call, backend, usage):
            if delta.text or delta.logprobs:
                yield chunk(shape.delta(delta))
            if delta.finish_reason:
                yield chunk(shape.end(delta.index, delta.finish_reason))
        if include_usage:
            yield data_event({**head, "choices": [], "usage": usage_object(usage)})
    finally:
        call.cancel()


async def _collect(call: Call, backend: Backend, accepted: llm_pb2.Accepted, shape: Shape, head: dict[str, Any]
                   ) -> dict[str, Any]:
    choices = [Collected() for _ in range(accepted.choices)]
    usage = common_pb2.Usage()
    async for delta in _deltas(call, backend, usage):
        choice = choices[delta.index]
        choice.parts.append(delta.text)
        choice.logprobs.extend(delta.logprobs)
        if delta.finish_reason:
            choice.finish_reason = delta.finish_reason
    return shape.response(head, choices, usage)
