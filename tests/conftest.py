"""Session fixtures: a real Triton (demo + test model repositories), the real services and the real
edge as separate processes on free loopback ports, started by the same code as `tritongate up`."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tritongate.demo_models import fetch_models, missing_models
from tritongate.settings import DEPLOY_DIR, Settings, default_cache_dir, default_models_dir
from tritongate.triton_local import TritonProcess, start_triton
from tritongate.up import LocalStack, grpc_serving  # noqa: F401 (tests import it from here)

TESTS = Path(__file__).resolve().parent
BODY_LIMIT = 4 * 1024 * 1024


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


def stack_settings(config_file: Path, **overrides: object) -> Settings:
    """Settings for a stack on free loopback ports."""
    ports = {f"{name}_port": free_port() for name in ("edge", "llm", "embed", "rerank")}
    return Settings(config_file=config_file, max_body_bytes=BODY_LIMIT, **ports, **overrides)  # type: ignore[arg-type]


def _spawn(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tritongate.cli", *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT)


@pytest.fixture(scope="session")
def stack(triton: TritonProcess, model_config_file: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[LocalStack]:
    """The services and the edge on the session's Triton; logs under the pytest temp folder."""
    with LocalStack(stack_settings(model_config_file), triton=triton, log_dir=tmp_path_factory.mktemp("logs"),
                    metrics_ports={name: free_port() for name in ("llm", "embed", "rerank")}) as local:
        yield local


@pytest.fixture(scope="session")
def client(stack: LocalStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.edge_url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="session")
def http(stack: LocalStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.edge_url, timeout=120) as session:
        yield session
