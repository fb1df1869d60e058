"""`tritongate up`: the whole stack on one machine: local Triton, the three services, the edge.

Each component runs as its own process (exactly as in a deployment); this supervisor starts them in
order, prints where to reach the API, and on Ctrl-C or SIGTERM stops them in reverse order.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from tritongate.config import load_model_config
from tritongate.settings import Settings
from tritongate.triton_local import TritonError, TritonProcess, start_triton

SERVICE_SECTIONS = {"llm": "llm", "embed": "embedding", "rerank": "rerank"}


def say(message: str) -> None:
    print(f"[tritongate] {message}", flush=True)


@dataclass
class Stack:
    settings: Settings
    triton: TritonProcess | None = None
    children: list[tuple[str, subprocess.Popen[bytes]]] = field(default_factory=list)
    stopping: bool = False

    def spawn(self, name: str, *args: str, env: dict[str, str]) -> None:
        process = subprocess.Popen([sys.executable, "-m", "tritongate.cli", name, *args], env=env)
        self.children.append((name, process))

    def failed_child(self) -> str | None:
        for name, process in self.children:
            if process.poll() is not None:
                return f"{name} exited with code {process.returncode}"
        if self.triton and self.triton.process.poll() is not None:
            return f"Triton exited: {self.triton.last_error()}"
        return None

    def stop(self) -> None:
        for _, process in reversed(self.children):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.settings.shutdown_grace_s + 5
        for _, process in reversed(self.children):
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.triton:
            self.triton.stop()


def _edge_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _wait(stack: Stack, what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stack.stopping:
        if callable(check) and check():
            return
        failure = stack.failed_child()
        if failure:
            raise TritonError(failure)
        time.sleep(0.3)
    if not stack.stopping:
        raise TritonError(f"{what} did not come up within {timeout:.0f} s")


def run_stack(settings: Settings, fetch: bool = True) -> int:
    config = load_model_config(settings.config_file)  # fail fast, before starting anything
    if fetch:
        from tritongate.demo_models import fetch_models, missing_models

        if missing_models(settings.models_dir):
            fetch_models(settings.models_dir)
    stack = Stack(settings)

    def request_stop(*_: object) -> None:
        stack.stopping = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    # The children read their settings from the environment: hand them what the flags changed.
    env = dict(os.environ, TRITONGATE_CONFIG_FILE=str(settings.config_file),
               TRITONGATE_MODELS_DIR=str(settings.models_dir), TRITONGATE_EDGE_HOST=settings.edge_host,
               TRITONGATE_EDGE_PORT=str(settings.edge_port))
    try:
        say("starting Triton (the first start loads the demo models, this can take a minute)")
        stack.triton = start_triton(
            repositories=settings.triton_model_repository, models_dir=settings.models_dir,
            cache_dir=settings.cache_dir, http_port=settings.triton_http_port,
            grpc_port=settings.triton_grpc_port, metrics_port=settings.triton_metrics_port,
        )
        stack.triton.wait_ready(settings.triton_start_timeout_s, lambda: stack.stopping)
        flags = ["--verbose"] if settings.verbose else []
        for name, section in SERVICE_SECTIONS.items():
            if getattr(config, section):
                stack.spawn(name, *flags, env=env)
        edge_url = f"http://{settings.edge_host}:{settings.edge_port}"
        stack.spawn("edge", "--uvicorn-log-level", settings.uvicorn_log_level, *flags, env=env)
        _wait(stack, "the edge", lambda: _edge_ready(edge_url), 120)
        if not stack.stopping:
            _announce(edge_url, config.embedding[0].name if config.embedding else "MODEL")
        while not stack.stopping:
            failure = stack.failed_child()
            if failure:
                raise TritonError(failure)
            time.sleep(0.5)
        say("stopping")
        return 0
    finally:
        stack.stop()


def _announce(url: str, embedding_model: str) -> None:
    say(f"ready: OpenAI API at {url}/v1 (docs: {url}/docs); Ctrl-C stops everything")
    print(f"""
  curl {url}/v1/models
  curl {url}/v1/embeddings -H 'Content-Type: application/json' \\
       -d '{{"model": "{embedding_model}", "input": "The food was delicious"}}'
""", flush=True)
