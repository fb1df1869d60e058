"""The LlmService gRPC servicer: thin, the work is in LanguageModel. `Generate` serves one generation per call;
`GenerateMany` many on one stream (`ManyGenerations`), their events written together.

The edge keeps a few GenerateMany streams open instead of making a Generate call per request: starting a
generation is then a message on an open stream, not a new RPC, and what the generations have to send at
the same moment (a turn of the event loop, or while the previous message is being written) leaves as one
message, so gRPC's cost per message is paid once for all of them. Each generation is served as the Generate
call it stands for, in a task of its own, by the rule of every request inside a shared RPC
(services/common/items.py): its request id, admission slot, deadline, metrics (as a Generate call), span,
and its failure as the status Generate would have ended with.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import grpc

from services.common.admission import Admission
from services.common.errors import invalid_argument, item_error, rpc
from services.common.items import ItemCalls
from services.common.server import ListModelsServicer, ModelSet
from services.llm.model import LanguageModel
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc
from tritongate.registry import LLM


class LlmServicer(ListModelsServicer[LanguageModel], llm_pb2_grpc.LlmServiceServicer):
    @rpc
    async def Generate(self, request: llm_pb2.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[llm_pb2.GenerateResponse]:
        model = self.models.get(request.model)
        async for response in model.generate(request, context.time_remaining()):
            yield response

    @rpc
    async def GenerateMany(self, request_iterator: AsyncIterator[llm_pb2.GenerateCall],
                           context: grpc.aio.ServicerContext) -> AsyncIterator[llm_pb2.GenerateEvents]:
        async for events in ManyGenerations(self.models, self.admission, self.stopping).serve(request_iterator):
            yield events


# The call each generation stands for.
GENERATE_CALL = (LLM.grpc_service, "Generate", "server_stream")


class ManyGenerations:
    """One GenerateMany stream: its generations, each in a task of its own, and the events they have ready."""

    def __init__(self, models: ModelSet[LanguageModel], admission: Admission | None, stopping: asyncio.Event) -> None:
        self.models = models
        self.calls = ItemCalls(GENERATE_CALL, "GenerateMany", admission, stopping)
        self.stopping = stopping  # set while the service drains: new generations go elsewhere
        self.running: dict[int, asyncio.Task[None]] = {}
        self.ready: list[llm_pb2.GenerateEvent] = []
        self.wake = asyncio.Event()

    async def serve(self, calls: AsyncIterator[llm_pb2.GenerateCall]) -> AsyncIterator[llm_pb2.GenerateEvents]:
        """The stream's messages: whatever is ready whenever the previous one has been written; the end once
        every generation has ended and the caller has closed its side, or the service is shutting down (so
        that a draining server need not wait for its callers to close their streams)."""
        reader = asyncio.create_task(self._read(calls))
        stopping = asyncio.create_task(self.stopping.wait())
        for task in (reader, stopping):
            task.add_done_callback(lambda _: self.wake.set())
        try:
            while True:
                if self.ready:
                    events, self.ready = self.ready, []
                    yield llm_pb2.GenerateEvents(events=events)
                elif reader.done() and not self.running:
                    reader.result()  # the caller's side ended; raise what ended it, if anything did
                    return
                elif stopping.done() and not self.running:
                    return
                else:
                    self.wake.clear()  # nothing can change between the checks above and this wait
                    await self.wake.wait()
        finally:
            reader.cancel()
            stopping.cancel()
            for task in list(self.running.values()):
                task.cancel()

    async def _read(self, calls: AsyncIterator[llm_pb2.GenerateCall]) -> None:
        async for call in calls:
            if call.HasField("start"):
                if call.id in self.running:
                    self._send(call.id, failure=item_error(invalid_argument(
                        f"Generation {call.id} is already in flight on this stream.")))
                    continue
                task = asyncio.create_task(self._generate(call))
                self.running[call.id] = task
                task.add_done_callback(functools.partial(self._ended, call.id))
            elif call.id in self.running:
                self.running[call.id].cancel()  # it ends without a further event

    async def _generate(self, call: llm_pb2.GenerateCall) -> None:
        failure = await self.calls.start(call.context).serve(functools.partial(self._run, call))
        if failure is not None:
            self._send(call.id, failure=failure)

    async def _run(self, call: llm_pb2.GenerateCall, timeout: float | None) -> None:
        model = self.models.get(call.start.model)
        async for response in model.generate(call.start, timeout):
            self._send(call.id, response=response)

    def _send(self, id: int, **event: object) -> None:
        self.ready.append(llm_pb2.GenerateEvent(id=id, **event))  # type: ignore[arg-type]
        self.wake.set()

    def _ended(self, id: int, task: asyncio.Task[None]) -> None:
        if self.running.get(id) is task:
            del self.running[id]
        self.wake.set()
