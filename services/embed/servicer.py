"""The EmbedService gRPC servicer: thin, the work is in Embedder."""

from __future__ import annotations

import grpc

from services.common.errors import rpc
from services.common.server import ListModelsServicer
from services.embed.embedder import Embedder
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc


class EmbedServicer(ListModelsServicer[Embedder], embed_pb2_grpc.EmbedServiceServicer):
    @rpc
    async def Embed(self, request: embed_pb2.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> embed_pb2.EmbedResponse:
        return await self.models.get(request.model).embed(request, context.time_remaining())
