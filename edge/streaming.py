"""The one code path of chat and completions, streamed or not.

The Generate stream starts; until the service's first message (`accepted`) any failure is an ordinary
HTTP error with the right status. Then either every delta becomes an SSE chunk (the endpoint's `Shape`
says how), or the deltas are collected into one response. A client that goes away cancels the stream,
which cancels the Triton requests.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import Request, Response

from edge.cancel import until_disconnected
from edge.clients import Generation, LlmClient
from edge.endpoints.common import usage_object
from edge.endpoints.llm_common import Collected, Shape
from edge.sse import data_event, sse_response
from tritongate.llm.v1 import llm_pb2


async def generate(request: Request, client: LlmClient, proto: llm_pb2.GenerateRequest, shape: Shape, *,
                   stream: bool, include_usage: bool, keepalive_s: float) -> Response:
    head = {"id": f"{shape.prefix}-{uuid.uuid4().hex}", "object": shape.object, "created": int(time.time()),
            "model": proto.model}
    generation = await client.generate(proto)
    try:
        accepted = await until_disconnected(request, generation.accepted())
    except BaseException:
        generation.cancel()
        raise
    if stream:
        return sse_response(_chunks(generation, accepted, shape, head, include_usage), keepalive_s)
    try:
        body = await until_disconnected(request, _collect(generation, accepted, shape, head))
    finally:
        generation.cancel()
    return Response(orjson.dumps(body), media_type="application/json")


async def _chunks(generation: Generation, accepted: llm_pb2.Accepted, shape: Shape, head: dict[str, Any],
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
        async for delta in generation.deltas():
            if delta.text or delta.logprobs or delta.tool_calls:
                yield chunk(shape.delta(delta))
            if delta.finish_reason:
                yield chunk(shape.end(delta.index, delta.finish_reason))
        if include_usage:
            yield data_event({**head, "choices": [], "usage": usage_object(generation.usage)})
    finally:
        generation.cancel()


async def _collect(generation: Generation, accepted: llm_pb2.Accepted, shape: Shape, head: dict[str, Any]
                   ) -> dict[str, Any]:
    choices = [Collected() for _ in range(accepted.choices)]
    async for delta in generation.deltas():
        choices[delta.index].add(delta)
    return shape.response(head, choices, generation.usage)
