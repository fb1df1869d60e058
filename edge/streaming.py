"""The one code path of every generation endpoint (chat, completions, Responses, Messages, interactive
chat), streamed or not.

The Generate stream starts; until the service's first message (`accepted`) any failure is an ordinary
HTTP error with the right status. Then either every delta becomes events (the endpoint's `Answer` says
how: its `Framing` writes chat and completions chunks, the Responses API's or Anthropic's events, or
interactive JSON lines), or the deltas are collected into one response (its `Collector`). A client that
goes away cancels the stream, which cancels the Triton requests.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from fastapi import Request, Response

from edge.app_state import edge_state
from edge.clients import Generation
from edge.endpoints.common import usage_object
from edge.endpoints.llm_common import Collected, Shape
from edge.generation import GenerationInput, affinity_header
from edge.images import attach
from edge.sse import data_event, sse_response
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

log = logging.getLogger(__name__)


class Collector(Protocol):
    """What the collecting side needs of an endpoint (chat and completions' `Shape` is one)."""

    object: str
    prefix: str  # of the response id

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        """The whole non-streamed response."""


class Framing(Protocol):
    """How one stream is written as SSE events (already encoded)."""

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        """Before any text (`accepted` has the prompt tokens and the number of choices)."""

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        """A delta carrying text or logprobs."""

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        """A choice is finished (`stop_string`: the stop string that ended it, if one did)."""

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        """Every choice is finished; `usage` is the request's."""


class ChunkFraming:
    """Chat and completions chunks: openings, one chunk per delta, an empty one with each finish reason,
    the usage chunk when asked."""

    def __init__(self, shape: Shape, head: dict[str, Any], include_usage: bool) -> None:
        self.shape = shape
        self.head = head
        self.include_usage = include_usage
        # Every chunk is the same head around one choice: the head is serialised once, each chunk adds its
        # choice (the bytes are those of `data_event({**head, "choices": [choice], "usage": None})`).
        self.prefix = b"data: " + orjson.dumps(head)[:-1] + b',"choices":['
        self.suffix = b'],"usage":null}\n\n' if include_usage else b"]}\n\n"

    def _chunk(self, choice: dict[str, Any]) -> bytes:
        return self.prefix + orjson.dumps(choice) + self.suffix

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        for index in range(accepted.choices):
            opening = self.shape.opening(index)
            if opening is not None:
                yield self._chunk(opening)

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        yield self._chunk(self.shape.delta(delta))

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        yield self._chunk(self.shape.end(index, finish_reason))

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        if self.include_usage:
            yield data_event({**self.head, "choices": [], "usage": usage_object(usage)})


@dataclass(frozen=True)
class Answer:
    """How an endpoint answers a generation: `collector` builds its whole response, `framing` writes its
    stream (as Server-Sent Events, unless `respond` writes it otherwise), and `persist` saves what the
    endpoint keeps of a finished generation (a stored Response, a session's turn) before the client sees
    the end."""

    collector: Collector
    framing: Callable[[dict[str, Any]], Framing]
    respond: Callable[[AsyncGenerator[bytes, None], float], Response] = sse_response
    persist: Callable[[], Awaitable[None]] | None = None


async def generate(request: Request, generation_input: GenerationInput, shape: Shape, include_usage: bool
                   ) -> Response:
    """Chat and completions."""
    return await run(request, generation_input,
                     Answer(shape, framing=lambda head: ChunkFraming(shape, head, include_usage)))


async def run(request: Request, generation_input: GenerationInput, answer: Answer) -> Response:
    """Any generation endpoint: the generation that `generation_input` asks for, answered as `answer` says."""
    state = edge_state(request)
    client = state.clients.llm
    head = {"id": f"{answer.collector.prefix}{uuid.uuid4().hex}", "object": answer.collector.object,
            "created": int(time.time()), "model": generation_input.model}
    if generation_input.hosted_tools:  # accepted, never offered to the model: say so once per request
        log.info("hosted tools not offered to the model (none can run here): %s", ", ".join(
            f"{tool.type} ({tool.param})" for tool in generation_input.hosted_tools))
    if generation_input.images:
        card = await client.directory.route(generation_input.model, client.service)
        await attach(generation_input.images, card, state.images)
    header = affinity_header(request.headers, state.settings.affinity_header)
    generation = await client.generate(generation_input.proto(header), generation_input.names)
    try:
        accepted = await generation.accepted()
    except BaseException:
        generation.cancel()
        raise
    if generation_input.stream:
        return answer.respond(_events(generation, accepted, answer.framing(head), answer.persist),
                              state.settings.sse_keepalive_s)
    try:
        body = await _collect(generation, accepted, answer.collector, head)
    finally:
        generation.cancel()
    if answer.persist is not None:
        await answer.persist()
    return Response(orjson.dumps(body), media_type="application/json")


async def _events(generation: Generation, accepted: llm_pb2.Accepted, framing: Framing,
                  persist: Callable[[], Awaitable[None]] | None) -> AsyncGenerator[bytes, None]:
    """The stream's events, those of one service message together (one write to the client)."""
    try:
        if opening := b"".join(framing.start(accepted)):
            yield opening
        async for delta in generation.deltas():
            events = [*framing.delta(delta)] if delta.text or delta.reasoning or delta.logprobs or delta.tool_calls \
                else []
            if delta.finish_reason:
                events.extend(framing.end(delta.index, delta.finish_reason, delta.stop_string))
            if events:
                yield b"".join(events)
        closing = b"".join(framing.finish(generation.usage))
        if persist is not None:
            await persist()
        if closing:
            yield closing
    finally:
        generation.cancel()


async def _collect(generation: Generation, accepted: llm_pb2.Accepted, collector: Collector,
                   head: dict[str, Any]) -> dict[str, Any]:
    choices = [Collected() for _ in range(accepted.choices)]
    async for delta in generation.deltas():
        choices[delta.index].add(delta)
    return collector.response(head, choices, generation.usage)
