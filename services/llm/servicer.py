"""The LlmService gRPC servicer: thin, the work is in LanguageModel."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.common.errors import rpc
from services.common.server import ListModelsServicer
from services.llm.many import ManyGenerations
from services.llm.model import LanguageModel
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc


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
