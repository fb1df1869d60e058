"""A stack whose internal gRPC channels use TLS, started the way `tritongate up` starts one: the embed
service serves with a certificate, the edge verifies it with the CA, and the stack's own readiness
probe and `tritongate health` speak TLS too. An API key rides along to the edge."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trustme

from launcher.stack import LocalStack
from tests.support.stack import stack_settings
from tritongate.triton_local import TritonProcess

KEY = "tg-tls-stack-key-0c7e1f"
NAME = "services.internal"  # the name in the certificate; the stack dials 127.0.0.1


@pytest.fixture(scope="module")
def tls_stack(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[LocalStack]:
    tmp = tmp_path_factory.mktemp("tls-stack")
    ca = trustme.CA()
    issued = ca.issue_cert(NAME)
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    issued.private_key_and_cert_chain_pem.write_to_path(str(tmp / "server.pem"))  # key and chain in one file
    config = json.loads(model_config_file.read_text())
    embed_only = tmp / "model_config.json"  # one service keeps the start short
    embed_only.write_text(json.dumps({"model_infos": config["model_infos"], "embedding": config["embedding"]}))
    pem = tmp / "server.pem"
    settings = stack_settings(embed_only, api_key=KEY, grpc_tls_cert=pem, grpc_tls_key=pem,
                              grpc_tls_ca=tmp / "ca.pem", grpc_tls_server_name=NAME)
    with LocalStack(settings, triton=triton, log_dir=tmp / "logs") as local:
        yield local


def test_requests_cross_the_tls_channel(tls_stack: LocalStack) -> None:
    body = {"model": "all-minilm-l6-v2", "input": ["tls", "works"]}
    response = httpx.post(f"{tls_stack.edge_url}/v1/embeddings", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert response.status_code == 200, response.text
    assert len(response.json()["data"]) == 2
    assert httpx.post(f"{tls_stack.edge_url}/v1/embeddings", json=body, timeout=60).status_code == 401
    health = httpx.get(f"{tls_stack.edge_url}/health", timeout=10).json()
    assert health["services"]["embed"] == "serving"


def _health_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "launcher.cli", "health", "embed", "--timeout", "5"],
                          env=env, capture_output=True, text=True, timeout=30)


def test_the_health_command_needs_the_ca(tls_stack: LocalStack) -> None:
    env = tls_stack.env()
    result = _health_cli(env)
    assert result.returncode == 0 and "SERVING" in result.stdout, result.stdout + result.stderr
    plain = {k: v for k, v in env.items() if not k.startswith("TRITONGATE_GRPC_TLS_")}
    result = _health_cli(plain)
    assert result.returncode == 1 and "unreachable" in result.stdout
    for log in (tls_stack.log_dir or Path()).glob("*.log"):
        assert KEY not in log.read_text(errors="replace"), log
