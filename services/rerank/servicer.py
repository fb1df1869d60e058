"""The RerankService gRPC servicer: thin, the work is in Reranker."""

from __future__ import annotations

import grpc

from services.common.errors import rpc
from services.common.server import ListModelsServicer
from services.rerank.reranker import Reranker
from tritongate.rerank.v1 import rerank_pb2, rerank_pb2_grpc


class RerankServicer(ListModelsServicer[Reranker], rerank_pb2_grpc.RerankServiceServicer):
    @rpc
    async def Rerank(self, request: rerank_pb2.RerankRequest, context: grpc.aio.ServicerContext
                     ) -> rerank_pb2.RerankResponse:
        return await self.models.get(request.model).rerank(request, context.time_remaining())
