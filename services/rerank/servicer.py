"""The RerankService gRPC servicer: thin, the work is in Reranker."""

from __future__ import annotations

import grpc

from services.common.batch import serve_batch
from services.common.errors import rpc
from services.common.items import ItemCalls
from services.common.server import ListModelsServicer
from services.rerank.reranker import Reranker
from tritongate.registry import RERANK
from tritongate.rerank.v1 import rerank_pb2, rerank_pb2_grpc

RERANK_CALL = (RERANK.grpc_service, "Rerank", "unary")  # the call each item of a RerankBatch stands for


class RerankServicer(ListModelsServicer[Reranker], rerank_pb2_grpc.RerankServiceServicer):
    @rpc
    async def Rerank(self, request: rerank_pb2.RerankRequest, context: grpc.aio.ServicerContext
                     ) -> rerank_pb2.RerankResponse:
        return await self.models.get(request.model).serve(request, context.time_remaining())

    @rpc
    async def RerankBatch(self, request: rerank_pb2.RerankBatchRequest, context: grpc.aio.ServicerContext
                          ) -> rerank_pb2.RerankBatchResponse:
        return await serve_batch(self.models, request, ItemCalls(RERANK_CALL, "RerankBatch", self.admission),
                                 rerank_pb2.RerankBatchResult, rerank_pb2.RerankBatchResponse)
