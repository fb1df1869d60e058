"""The one rule for a request inside a shared RPC (services/common/items.py), as the batch RPCs use it:
each item counts as the unary call it stands for and under its batch RPC, holds an admission slot of its
own until it ends, and ends when the RPC is cancelled. (GenerateMany's generations: tests/service/
test_generate_many.py; their spans: tests/unit/test_tracing.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
from prometheus_client import REGISTRY

from services.common.admission import Admission
from services.common.batch import serve_batch
from services.common.errors import invalid_argument
from services.common.items import ItemCalls
from services.embed.servicer import EMBED_CALL
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2


class Model:
    """Answers "ok", refuses anything else; waits for `release` first."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    async def serve_many(self, requests: Sequence[Any], timeout: float | None) -> list[Any]:
        self.started.set()
        await self.release.wait()
        return [embed_pb2.EmbedResponse() if request.texts.texts[0] == "ok" else invalid_argument("bad", "input")
                for request in requests]


class Models:
    def __init__(self) -> None:
        self.model = Model()

    def get(self, name: str) -> Model:
        return self.model


def batch(*texts: str) -> embed_pb2.EmbedBatchRequest:
    return embed_pb2.EmbedBatchRequest(items=[
        embed_pb2.EmbedBatchItem(request=embed_pb2.EmbedRequest(model="m", texts=embed_pb2.TextBatch(texts=[text])),
                                 context=common_pb2.ItemContext(request_id=f"r{i}", timeout_s=5))
        for i, text in enumerate(texts)])


def counts(code: str) -> tuple[float, float]:
    """(Embed calls handled with `code`, EmbedBatch items with that outcome) so far."""
    service, method, kind = EMBED_CALL
    handled = REGISTRY.get_sample_value("grpc_server_handled_total", {
        "grpc_service": service, "grpc_method": method, "grpc_type": kind, "grpc_code": code})
    batched = REGISTRY.get_sample_value("tritongate_batched_requests_total",
                                        {"grpc_method": "EmbedBatch", "outcome": code})
    return handled or 0.0, batched or 0.0


async def serve(models: Models, request: embed_pb2.EmbedBatchRequest, admission: Admission) -> Any:
    return await serve_batch(models, request, ItemCalls(EMBED_CALL, "EmbedBatch", admission),  # type: ignore[arg-type]
                             embed_pb2.EmbedBatchResult, embed_pb2.EmbedBatchResponse)


async def test_each_item_counts_as_the_call_it_stands_for_and_holds_its_own_slot() -> None:
    admission = Admission(2)
    before = {code: counts(code) for code in ("OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED")}
    response = await serve(Models(), batch("ok", "no", "ok"), admission)
    outcomes = [(r.WhichOneof("outcome"), r.error.code) for r in response.results]
    assert outcomes == [("response", 0), ("error", grpc.StatusCode.INVALID_ARGUMENT.value[0]),
                        ("error", grpc.StatusCode.RESOURCE_EXHAUSTED.value[0])]  # the third found no slot
    for code, (handled, batched) in before.items():
        assert counts(code) == (handled + 1, batched + 1), code
    assert admission.in_flight == 0


async def test_a_cancelled_batch_rpc_ends_its_items() -> None:
    models, admission = Models(), Admission(8)
    models.model.release.clear()
    cancelled = counts("CANCELLED")
    rpc = asyncio.create_task(serve(models, batch("ok", "ok"), admission))
    await models.model.started.wait()
    assert admission.in_flight == 2
    rpc.cancel()
    await asyncio.gather(rpc, return_exceptions=True)
    assert admission.in_flight == 0
    assert counts("CANCELLED") == (cancelled[0] + 2, cancelled[1] + 2)
