"""The EmbedService gRPC servicer: thin, the work is in Embedder."""

from __future__ import annotations

import grpc

from services.common.batch import serve_batch
from services.common.errors import rpc
from services.common.items import ItemCalls
from services.common.server import ListModelsServicer
from services.embed.embedder import Embedder
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc
from tritongate.registry import EMBED

EMBED_CALL = (EMBED.grpc_service, "Embed", "unary")  # the call each item of an EmbedBatch stands for


class EmbedServicer(ListModelsServicer[Embedder], embed_pb2_grpc.EmbedServiceServicer):
    @rpc
    async def Embed(self, request: embed_pb2.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> embed_pb2.EmbedResponse:
        return await self.models.get(request.model).serve(request, context.time_remaining())

    @rpc
    async def EmbedBatch(self, request: embed_pb2.EmbedBatchRequest, context: grpc.aio.ServicerContext
                         ) -> embed_pb2.EmbedBatchResponse:
        return await serve_batch(self.models, request, ItemCalls(EMBED_CALL, "EmbedBatch", self.admission),
                                 embed_pb2.EmbedBatchResult, embed_pb2.EmbedBatchResponse)
