"""TLS on the internal gRPC channels: a real embed service serving with a certificate from a throwaway
CA, reached through the edge's own channel factory and through the health probe."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge.channels import open_channel
from launcher.healthcheck import probe
from services.common.server import LIVENESS, RunningService, ServerOptions, start_service
from services.common.triton import Triton
from services.embed.main import build
from tritongate.common.v1 import common_pb2
from tritongate.config import ConfigError, load_model_config
from tritongate.embed.v1 import embed_pb2_grpc
from tritongate.registry import EMBED
from tritongate.settings import Settings
from tritongate.tls import client_tls, server_credentials

NAME = "embed.internal"  # the name in the certificate; clients dial 127.0.0.1, so they must override it


@dataclass
class Pki:
    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    directory = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    issued = ca.issue_cert(NAME)
    paths = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    ca.cert_pem.write_to_path(str(paths.ca))
    issued.private_key_pem.write_to_path(str(paths.key))
    for pem in issued.cert_chain_pems:
        pem.write_to_path(str(paths.cert), append=True)
    return paths


@pytest.fixture(scope="module")
async def service(model_config_file: Path, pki: Pki) -> AsyncIterator[RunningService]:
    credentials = server_credentials(Settings(grpc_tls_cert=pki.cert, grpc_tls_key=pki.key))
    assert credentials is not None
    triton = Triton()
    spec = build(load_model_config(model_config_file), triton)
    server = await start_service(spec, triton, host="127.0.0.1", port=0, options=ServerOptions(credentials))
    yield server
    await server.stop(1)


def tls_channel(port: int, pki: Pki, server_name: str | None = NAME) -> grpc.aio.Channel:
    tls = client_tls(Settings(grpc_tls_ca=pki.ca, grpc_tls_server_name=server_name))
    assert tls is not None
    return open_channel(f"127.0.0.1:{port}", EMBED, tls)


async def test_the_edge_channel_with_the_ca_lists_models_and_reads_health(service: RunningService,
                                                                         pki: Pki) -> None:
    async with tls_channel(service.port, pki) as channel:
        models = await embed_pb2_grpc.EmbedServiceStub(channel).ListModels(common_pb2.ListModelsRequest(), timeout=10)
        health = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=LIVENESS), timeout=10)
    assert "all-minilm-l6-v2" in {model.id for model in models.models}
    assert health.status == health_pb2.HealthCheckResponse.SERVING


async def test_a_plaintext_channel_to_the_tls_port_fails(service: RunningService) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await embed_pb2_grpc.EmbedServiceStub(channel).ListModels(common_pb2.ListModelsRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_certificate_for_another_name_is_refused(service: RunningService, pki: Pki) -> None:
    async with tls_channel(service.port, pki, server_name=None) as channel:  # checks "127.0.0.1"
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await embed_pb2_grpc.EmbedServiceStub(channel).ListModels(common_pb2.ListModelsRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_the_health_probe_speaks_tls_when_given_the_ca(service: RunningService, pki: Pki) -> None:
    target = f"127.0.0.1:{service.port}"
    tls = client_tls(Settings(grpc_tls_ca=pki.ca, grpc_tls_server_name=NAME))
    for _ in range(100):  # SERVING once the watcher has seen the Triton model ready
        healthy, seen = await asyncio.to_thread(probe, target, 5, tls)
        if healthy:
            break
        await asyncio.sleep(0.1)
    assert (healthy, seen) == (True, "SERVING")
    healthy, seen = await asyncio.to_thread(probe, target, 5)
    assert not healthy and seen.startswith("unreachable")


def test_half_or_unreadable_tls_settings_fail_at_start(pki: Pki, tmp_path: Path) -> None:
    assert server_credentials(Settings()) is None and client_tls(Settings()) is None
    with pytest.raises(ConfigError, match="set together"):
        server_credentials(Settings(grpc_tls_cert=pki.cert))
    with pytest.raises(ConfigError, match="TRITONGATE_GRPC_TLS_CA: cannot read"):
        client_tls(Settings(grpc_tls_ca=tmp_path / "absent.pem"))
