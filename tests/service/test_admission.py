"""The admission bound on a real grpc.aio server on port 0 (a fake embed servicer that waits until
released, so calls pile up): beyond the bound an inference RPC is refused at once, probes are not."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from services.common.admission import AdmissionInterceptor
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc
from tritongate.registry import EMBED
from tritongate.wire import CODE_KEY, OVERLOADED

SERVICE = EMBED.grpc_service
LIMIT = 2


class WaitingEmbed(embed_pb2_grpc.EmbedServiceServicer):
    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def Embed(self, request: embed_pb2.EmbedRequest, context: grpc.aio.ServicerContext
                    ) -> embed_pb2.EmbedResponse:
        self.started += 1
        await self.release.wait()
        return embed_pb2.EmbedResponse(model=request.model)

    async def ListModels(self, request: common_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
                         ) -> common_pb2.ListModelsResponse:
        return common_pb2.ListModelsResponse()


@pytest.fixture
async def server() -> AsyncIterator[tuple[WaitingEmbed, AdmissionInterceptor, str]]:
    interceptor = AdmissionInterceptor(LIMIT, (SERVICE,))
    grpc_server = grpc.aio.server(interceptors=[interceptor])
    servicer = WaitingEmbed()
    embed_pb2_grpc.add_EmbedServiceServicer_to_server(servicer, grpc_server)
    health = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, grpc_server)
    await health.set("", health_pb2.HealthCheckResponse.SERVING)
    port = grpc_server.add_insecure_port("127.0.0.1:0")
    await grpc_server.start()
    yield servicer, interceptor, f"127.0.0.1:{port}"
    servicer.release.set()
    await grpc_server.stop(1)


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_beyond_the_bound_inference_is_refused_at_once_and_probes_still_answer(
        server: tuple[WaitingEmbed, AdmissionInterceptor, str]) -> None:
    servicer, interceptor, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        request = embed_pb2.EmbedRequest(model="m")
        admitted = [asyncio.ensure_future(stub.Embed(request, timeout=10)) for _ in range(LIMIT)]
        await until(lambda: servicer.started == LIMIT, "the admitted calls never started")
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.Embed(request, timeout=5)
        error = info.value
        assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert f"limit of {LIMIT} concurrent requests (max_in_flight)" in (error.details() or "")
        assert (CODE_KEY, OVERLOADED) in list(error.trailing_metadata() or ())
        assert servicer.started == LIMIT  # the refused call never reached the servicer
        # Health and ListModels are not counted: probes keep working under overload.
        health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        await stub.ListModels(common_pb2.ListModelsRequest(), timeout=5)

        servicer.release.set()
        assert [r.model for r in await asyncio.gather(*admitted)] == ["m"] * LIMIT
        assert (await stub.Embed(request, timeout=5)).model == "m"
        assert interceptor.admission.in_flight == 0


async def test_a_cancelled_call_frees_its_slot(server: tuple[WaitingEmbed, AdmissionInterceptor, str]) -> None:
    servicer, interceptor, address = server
    async with grpc.aio.insecure_channel(address) as channel:
        stub = embed_pb2_grpc.EmbedServiceStub(channel)
        calls = [stub.Embed(embed_pb2.EmbedRequest(model="m"), timeout=10) for _ in range(LIMIT)]
        await until(lambda: interceptor.admission.in_flight == LIMIT, "the calls were never admitted")
        for call in calls:
            call.cancel()
        await until(lambda: interceptor.admission.in_flight == 0, "cancelled calls kept their slots")
        servicer.release.set()
        assert (await stub.Embed(embed_pb2.EmbedRequest(model="m"), timeout=5)).model == "m"
