"""The rerank service as a real grpc.aio server on port 0, against the session's real Triton."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from services.common.server import RunningService, start_service
from services.common.triton import Triton
from services.rerank.main import build
from tests.support.ports import free_port
from tritongate.common.v1 import common_pb2
from tritongate.config import load_model_config
from tritongate.rerank.v1 import rerank_pb2, rerank_pb2_grpc

MODEL = "minilm-rerank"


async def running(config_file: Path) -> RunningService:
    triton = Triton()
    return await start_service(build(load_model_config(config_file), triton), triton, host="127.0.0.1", port=0)


@pytest.fixture(scope="module")
async def service(model_config_file: Path) -> AsyncIterator[RunningService]:
    server = await running(model_config_file)
    yield server
    await server.stop(1)


async def test_documents_come_back_sorted_by_score(service: RunningService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = rerank_pb2_grpc.RerankServiceStub(channel)
        response = await stub.Rerank(rerank_pb2.RerankRequest(
            model=MODEL, query="What is the capital of France?",
            documents=["Bananas are yellow.", "Paris is the capital of France."]))
        models = await stub.ListModels(common_pb2.ListModelsRequest())
    assert [r.index for r in response.results] == [1, 0]
    assert response.results[0].score > response.results[1].score and response.usage.prompt_tokens > 0
    card = next(m for m in models.models if m.id == MODEL)
    assert card.kind == common_pb2.MODEL_KIND_RERANK and card.max_model_len == 256


async def test_zero_documents_give_an_empty_result_without_triton(model_config_file: Path, tmp_path: Path) -> None:
    """The edge refuses empty `documents`; a direct caller gets nothing to score, and Triton is not asked
    (here there is no Triton at all)."""
    config = json.loads(model_config_file.read_text())  # noqa: ASYNC240 (test set-up)
    for entry in config["rerank"]:
        entry["url"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    dead = tmp_path / "dead.json"
    dead.write_text(json.dumps(config))
    server = await running(dead)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            response = await rerank_pb2_grpc.RerankServiceStub(channel).Rerank(
                rerank_pb2.RerankRequest(model=MODEL, query="anything"), timeout=5)
        assert response == rerank_pb2.RerankResponse(model=MODEL, usage=common_pb2.Usage())
    finally:
        await server.stop(1)


async def test_a_batch_call_answers_each_request_as_its_own_call_would(service: RunningService) -> None:
    documents = ["Bananas are yellow.", "Paris is the capital of France.", "word " * 400]
    requests = [
        rerank_pb2.RerankRequest(model=MODEL, query="What is the capital of France?", documents=documents),
        rerank_pb2.RerankRequest(model=MODEL, query="long " * 300, documents=documents),  # no room left
        rerank_pb2.RerankRequest(model=MODEL, query="Which fruit is yellow?", documents=documents, truncate=False),
        rerank_pb2.RerankRequest(model=MODEL, query="Which fruit is yellow?", documents=documents[:2], top_n=1,
                                 truncate=False),
    ]
    items = [rerank_pb2.RerankBatchItem(request=r, context=common_pb2.ItemContext(request_id=f"r{i}"))
             for i, r in enumerate(requests)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = rerank_pb2_grpc.RerankServiceStub(channel)
        batch = await stub.RerankBatch(rerank_pb2.RerankBatchRequest(items=items))
        alone = [await stub.Rerank(requests[i]) for i in (0, 3)]
    results = list(batch.results)
    assert [r.WhichOneof("outcome") for r in results] == ["response", "error", "error", "response"]
    assert (results[1].error.code, results[1].error.param) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "query")
    assert (results[2].error.code, results[2].error.param) == (grpc.StatusCode.INVALID_ARGUMENT.value[0],
                                                               "documents")
    for together, own in zip((results[0], results[3]), alone, strict=True):
        assert [r.index for r in together.response.results] == [r.index for r in own.results]
        assert together.response.usage == own.usage
        assert [r.score for r in together.response.results] == pytest.approx([r.score for r in own.results],
                                                                              abs=1e-4)
