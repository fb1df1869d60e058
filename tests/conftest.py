"""Session fixtures: a real Triton (demo + test model repositories), the real services and the real
edge as separate processes on free loopback ports, exactly as `tritongate up` runs them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tritongate.demo_models import fetch_models, missing_models
from tritongate.settings import DEPLOY_DIR, default_cache_dir, default_models_dir
from tritongate.triton_local import TritonProcess, start_triton

TESTS = Path(__file__).resolve().parent
BODY_LIMIT = 4 * 1024 * 1024
SERVICE_SECTIONS = {"llm": "llm", "embed": "embedding", "rerank": "rerank"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(check, timeout: float, what: str, process: subprocess.Popen[bytes] | None = None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout} s")


def grpc_serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture(scope="session")
def models_dir() -> Path:
    directory = default_models_dir()
    if missing_models(directory):
        fetch_models(directory)
    return directory


@pytest.fixture(scope="session")
def events_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Test models append what they observe (e.g. a cancelled request) here, one JSON per line."""
    path = tmp_path_factory.mktemp("events") / "events.jsonl"
    path.touch()
    return path


@pytest.fixture(scope="session")
def triton(models_dir: Path, events_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonProcess]:
    process = start_triton(
        repositories=[DEPLOY_DIR / "triton", TESTS / "triton_models"],
        models_dir=models_dir,
        cache_dir=default_cache_dir(),
        http_port=free_port(),
        grpc_port=free_port(),
        metrics_port=free_port(),
        log_path=tmp_path_factory.mktemp("triton") / "tritonserver.log",
        extra_env={"TRITONGATE_TEST_EVENTS": str(events_file)},
    )
    try:
        process.wait_ready(600)
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="session")
def model_config_file(triton: TritonProcess, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/model_config.json (the seed's format) pointed at the test Triton."""
    config = json.loads((TESTS / "model_config.json").read_text())
    for section in ("llm", "embedding", "rerank"):
        for entry in config.get(section, []):
            entry["url"] = triton.grpc_url
    path = tmp_path_factory.mktemp("config") / "model_config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


@dataclass
class Stack:
    edge_url: str
    service_addresses: dict[str, str]
    config_file: Path
    triton: TritonProcess

    @property
    def base_url(self) -> str:
        return f"{self.edge_url}/v1"


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tritongate.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def stack(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    logs = tmp_path_factory.mktemp("logs")
    config = json.loads(model_config_file.read_text())
    env = dict(os.environ, TRITONGATE_CONFIG_FILE=str(model_config_file), LOG_LEVEL="INFO",
               TRITONGATE_MAX_BODY_BYTES=str(BODY_LIMIT))
    processes: list[subprocess.Popen[bytes]] = []
    addresses: dict[str, str] = {}
    try:
        for name, section in SERVICE_SECTIONS.items():
            if config.get(section):
                port = free_port()
                addresses[name] = f"127.0.0.1:{port}"
                processes.append(_spawn([name, "--port", str(port)], env, logs / f"{name}.log"))
        edge_port = free_port()
        targets = [f"--{name}={addresses.get(name, f'127.0.0.1:{free_port()}')}" for name in SERVICE_SECTIONS]
        processes.append(_spawn(["edge", "--port", str(edge_port), *targets], env, logs / "edge.log"))
        for process, (name, address) in zip(processes, addresses.items(), strict=False):
            wait_until(lambda a=address: grpc_serving(a), 180, f"{name} service", process)
        edge_url = f"http://127.0.0.1:{edge_port}"

        def edge_up() -> bool:
            try:
                return httpx.get(f"{edge_url}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(edge_up, 60, "edge", processes[-1])
        yield Stack(edge_url, addresses, model_config_file, triton)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()


@pytest.fixture(scope="session")
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.edge_url, timeout=120) as session:
        yield session
