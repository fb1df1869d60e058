"""The embed service as a real grpc.aio server on port 0, against the session's real Triton."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from services.common.server import RunningService, ServerOptions, start_service
from services.common.triton import Triton
from services.embed.main import build
from tests.support.ports import free_port
from tritongate.common.v1 import common_pb2
from tritongate.config import load_model_config
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc

SERVICE = "tritongate.embed.v1.EmbedService"


async def running(config_file: Path) -> RunningService:
    triton = Triton()
    spec = build(load_model_config(config_file), triton)
    return await start_service(spec, triton, host="127.0.0.1", port=0)


@pytest.fixture(scope="module")
async def service(model_config_file: Path) -> AsyncIterator[RunningService]:
    server = await running(model_config_file)
    yield server
    await server.stop(1)


async def health(port: int, name: str = "") -> int:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=name))
        return int(response.status)


async def until_serving(port: int) -> None:
    for _ in range(100):
        if await health(port, SERVICE) == health_pb2.HealthCheckResponse.SERVING:
            return
        await asyncio.sleep(0.1)
    raise AssertionError("never SERVING")


async def test_health_goes_serving_and_reflection_lists_the_services(service: RunningService) -> None:
    await until_serving(service.port)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
            yield reflection_pb2.ServerReflectionRequest(list_services="")

        names = {s.name async for r in stub.ServerReflectionInfo(ask()) for s in r.list_services_response.service}
    assert {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= names


async def test_embed_returns_float32_bytes_and_usage(service: RunningService) -> None:
    await until_serving(service.port)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        request = embed_pb2.EmbedRequest(model="all-minilm-l6-v2", texts=embed_pb2.TextBatch(texts=["a", "b c"]))
        response = await stub.Embed(request)
        models = await stub.ListModels(common_pb2.ListModelsRequest())
    vectors = np.frombuffer(response.embeddings, dtype="<f4").reshape(response.rows, response.dimensions)
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert response.usage.prompt_tokens == 3 + 4
    card = next(m for m in models.models if m.id == "all-minilm-l6-v2")
    assert card.kind == common_pb2.MODEL_KIND_EMBEDDING and card.dimensions == 384 and card.max_model_len == 256


@pytest.mark.parametrize(("request_", "code", "param"), [
    (embed_pb2.EmbedRequest(model="nope", texts=embed_pb2.TextBatch(texts=["a"])), grpc.StatusCode.NOT_FOUND, "model"),
    (embed_pb2.EmbedRequest(model="all-minilm-l6-v2", tokens=embed_pb2.TokenBatch(inputs=[
        common_pb2.TokenIds(ids=[101]), common_pb2.TokenIds(ids=[101, 40000])])),
     grpc.StatusCode.INVALID_ARGUMENT, "input"),
    (embed_pb2.EmbedRequest(model="all-minilm-l6-v2", texts=embed_pb2.TextBatch(texts=["a"]), dimensions=1000),
     grpc.StatusCode.INVALID_ARGUMENT, "dimensions"),
])
async def test_errors_carry_a_code_and_the_parameter(service: RunningService, request_: embed_pb2.EmbedRequest,
                                                     code: grpc.StatusCode, param: str) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await embed_pb2_grpc.EmbedServiceStub(channel).Embed(request_)
    assert info.value.code() == code
    assert ("tg-param", param) in tuple(info.value.trailing_metadata() or ())


async def test_without_triton_the_service_is_not_serving_and_says_unavailable(
        model_config_file: Path, tmp_path: Path) -> None:
    config = json.loads(model_config_file.read_text())  # noqa: ASYNC240 (test set-up)
    for entry in config["embedding"]:
        entry["url"] = f"127.0.0.1:{free_port()}"  # nothing listens there
    dead = tmp_path / "dead.json"
    dead.write_text(json.dumps(config))
    server = await running(dead)
    try:
        await asyncio.sleep(1.5)
        assert await health(server.port) == health_pb2.HealthCheckResponse.NOT_SERVING
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await embed_pb2_grpc.EmbedServiceStub(channel).Embed(
                    embed_pb2.EmbedRequest(model="all-minilm-l6-v2", texts=embed_pb2.TextBatch(texts=["a"])))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        # Why, in a word a client may see: Triton unreachable (not "reports it not ready"), without its address.
        assert (info.value.details() or "").endswith("Triton did not answer (StatusCode.UNAVAILABLE)")
    finally:
        await server.stop(1)


async def test_a_batch_call_answers_each_request_as_its_own_call_would(service: RunningService) -> None:
    await until_serving(service.port)
    model = "all-minilm-l6-v2"
    requests = [
        embed_pb2.EmbedRequest(model=model, texts=embed_pb2.TextBatch(texts=["a", "b c"])),
        embed_pb2.EmbedRequest(model="nope", texts=embed_pb2.TextBatch(texts=["a"])),
        embed_pb2.EmbedRequest(model=model, texts=embed_pb2.TextBatch(texts=["a"]), dimensions=1000),
        embed_pb2.EmbedRequest(model=model, tokens=embed_pb2.TokenBatch(inputs=[common_pb2.TokenIds(ids=[101, 102])])),
        embed_pb2.EmbedRequest(model=model, texts=embed_pb2.TextBatch(texts=["the third"]), dimensions=8),
    ]
    items = [embed_pb2.EmbedBatchItem(request=r, context=common_pb2.ItemContext(request_id=f"r{i}", timeout_s=30))
             for i, r in enumerate(requests)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        batch = await stub.EmbedBatch(embed_pb2.EmbedBatchRequest(items=items))
        alone = [await stub.Embed(requests[i]) for i in (0, 3, 4)]
    results = list(batch.results)
    assert [r.WhichOneof("outcome") for r in results] == ["response", "error", "error", "response", "response"]
    assert (results[1].error.code, results[1].error.param, results[1].error.error_code) == (
        grpc.StatusCode.NOT_FOUND.value[0], "model", "model_not_found")
    assert (results[2].error.code, results[2].error.param) == (grpc.StatusCode.INVALID_ARGUMENT.value[0], "dimensions")
    for together, own in zip((results[0], results[3], results[4]), alone, strict=True):
        assert (together.response.rows, together.response.dimensions, together.response.usage) == (
            own.rows, own.dimensions, own.usage)
        np.testing.assert_allclose(np.frombuffer(together.response.embeddings, "<f4"),
                                   np.frombuffer(own.embeddings, "<f4"), atol=1e-5)


async def test_a_batch_call_takes_an_admission_slot_per_request(model_config_file: Path) -> None:
    triton = Triton()
    spec = build(load_model_config(model_config_file), triton)
    server = await start_service(spec, triton, host="127.0.0.1", port=0, options=ServerOptions(max_in_flight=2))
    try:
        await until_serving(server.port)
        request = embed_pb2.EmbedRequest(model="all-minilm-l6-v2", texts=embed_pb2.TextBatch(texts=["a"]))
        items = [embed_pb2.EmbedBatchItem(request=request) for _ in range(3)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            batch = await embed_pb2_grpc.EmbedServiceStub(channel).EmbedBatch(embed_pb2.EmbedBatchRequest(items=items))
        outcomes = [r.WhichOneof("outcome") for r in batch.results]
        assert outcomes == ["response", "response", "error"]
        assert batch.results[2].error.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        assert batch.results[2].error.error_code == "overloaded"
    finally:
        await server.stop(1)
