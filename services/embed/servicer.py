"""The EmbedService gRPC servicer: thin, the work is in Embedder."""

from __future__ import annotations

import grpc

from services.common.errors import rpc
from services.common.server import ModelSet
from services.embed.embedder import Embedder
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc


class EmbedServicer(embed_pb2_grpc.EmbedServiceServicer):
    def __init__(self, models: ModelSet[Embedder]) -> None:
        self.models = models

    @rpc
    async def Embed(self, request: embed_pb2.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> embed_pb2.EmbedResponse:
        return await self.models.get(request.model).embed(request, context.time_remaining())

    @rpc
    async def ListModels(self, request: common_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
                         ) -> common_pb2.ListModelsResponse:
        return self.models.list_models()
