"""The edge's GenerateMany streams (edge/many.py) against a scripted llm service on a real grpc.aio server:
what the real service cannot be made to do on demand (hang, break a stream, end one early)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc

from edge.errors import OpenAIError, from_item
from edge.many import GenerateStreams, ManyGeneration
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc


class Scripted(llm_pb2_grpc.LlmServiceServicer):
    """Each GenerateMany stream acts as `plan[n]` says (the n-th stream; the last entry for the rest):
    "answer" (accepted, then usage), "hang" (reads, answers nothing), "break" (aborts UNAVAILABLE at the first
    start), "internal" (aborts INTERNAL, as a killed service's connection can end), "end" (ends the stream
    at the first start, as a draining service does)."""

    def __init__(self, *plan: str) -> None:
        self.plan = plan
        self.streams = 0
        self.calls: list[tuple[int, str]] = []  # (stream, "start <id>" / "cancel <id>")

    async def GenerateMany(self, request_iterator: AsyncIterator[llm_pb2.GenerateCall],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[llm_pb2.GenerateEvents]:
        number = self.streams
        self.streams += 1
        act = self.plan[min(number, len(self.plan) - 1)]
        async for call in request_iterator:
            self.calls.append((number, f"{call.WhichOneof('action')} {call.id}"))
            if call.HasField("cancel") or act == "hang":
                continue
            if act == "break":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "going away")
            if act == "internal":
                await context.abort(grpc.StatusCode.INTERNAL, "Internal error from Core")
            if act == "end":
                return
            yield llm_pb2.GenerateEvents(events=[
                llm_pb2.GenerateEvent(id=call.id, response=llm_pb2.GenerateResponse(
                    accepted=llm_pb2.Accepted(prompt_tokens=1, choices=1))),
                llm_pb2.GenerateEvent(id=call.id, response=llm_pb2.GenerateResponse(
                    usage=common_pb2.Usage(prompt_tokens=1)))])


async def streams_on(service: Scripted) -> tuple[grpc.aio.Server, grpc.aio.Channel, GenerateStreams]:
    server = grpc.aio.server()
    llm_pb2_grpc.add_LlmServiceServicer_to_server(service, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    streams = GenerateStreams(llm_pb2_grpc.LlmServiceStub(channel), 1, lambda error: from_item(error, "llm"))
    return server, channel, streams


async def run(service: Scripted, timeout_s: float = 0) -> tuple[list[Any], ManyGeneration]:
    """One generation's messages (or the error that ended them) on `service`."""
    server, channel, streams = await streams_on(service)
    try:
        generation = ManyGeneration(streams, llm_pb2.GenerateRequest(model="m"),
                                    common_pb2.ItemContext(timeout_s=timeout_s))
        seen: list[Any] = []
        try:
            while (message := await generation.next()) is not None:
                seen.append(message.WhichOneof("event"))
        except OpenAIError as exc:
            seen.append(exc)
        await asyncio.sleep(0.1)  # let a cancellation reach the service
        return seen, generation
    finally:
        await streams.close()
        await channel.close()
        await server.stop(0)


async def test_a_generation_ends_after_the_usage() -> None:
    seen, _ = await run(Scripted("answer"))
    assert seen == ["accepted", "usage"]


async def test_a_stream_that_breaks_before_acceptance_is_tried_once_more() -> None:
    service = Scripted("break", "answer")
    seen, generation = await run(service)
    assert seen == ["accepted", "usage"] and generation.retried and service.streams == 2


async def test_a_second_break_is_the_clients_503() -> None:
    seen, _ = await run(Scripted("break"))
    assert len(seen) == 1 and isinstance(seen[0], OpenAIError) and seen[0].status == 503


async def test_a_stream_broken_with_any_code_is_the_service_unavailable() -> None:
    """The generation's own failures come as its events; the stream's failure is the service's absence."""
    seen, generation = await run(Scripted("internal", "answer"))
    assert seen == ["accepted", "usage"] and generation.retried
    seen, _ = await run(Scripted("internal"))
    assert len(seen) == 1 and isinstance(seen[0], OpenAIError) and seen[0].status == 503


async def test_a_generation_on_a_stream_the_service_closed_is_tried_once_more() -> None:
    seen, generation = await run(Scripted("end", "answer"))
    assert seen == ["accepted", "usage"] and generation.retried
    seen, _ = await run(Scripted("end"))
    assert len(seen) == 1 and isinstance(seen[0], OpenAIError) and seen[0].status == 503


async def test_a_service_that_does_not_answer_meets_the_edges_deadline() -> None:
    service = Scripted("hang")
    seen, _ = await run(service, timeout_s=0.2)
    assert len(seen) == 1 and isinstance(seen[0], OpenAIError) and seen[0].status == 504
    assert service.calls == [(0, "start 0"), (0, "cancel 0")]  # and the service was told
