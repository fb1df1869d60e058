"""Edge processes of their own in front of the session's services, and `tritongate keys` on their store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from launcher.stack import LocalStack, http_ok
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn
from tritongate.registry import SERVICES


@contextmanager
def edges(stack: LocalStack, env: dict[str, str], logs: Path, count: int = 1) -> Iterator[list[str]]:
    """`count` edge processes with `env` (their state store, their queue...) at the session's services; their
    URLs."""
    processes: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for _ in range(count):
            port = free_port()
            targets = [f"--{service.name}={stack.service_address(service)}" for service in SERVICES]
            process = spawn(["edge", "--port", str(port), *targets], dict(os.environ, **env),
                            logs / f"edge-{port}.log")
            processes.append(process)
            urls.append(f"http://127.0.0.1:{port}")
        for url, process in zip(urls, processes, strict=True):
            wait_until(lambda url=url: http_ok(f"{url}/health"), 60, "the edge", process)
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(30)


def keys_command(state_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`tritongate keys *args` on the store at `state_url`."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", "keys", *args], capture_output=True, text=True,
                          env=dict(os.environ, TRITONGATE_STATE_URL=state_url), timeout=60, check=False)


def create_key(state_url: str, name: str, *rules: str) -> str:
    done = keys_command(state_url, "create", name, *rules, "--json")
    assert done.returncode == 0, done.stderr
    key: str = json.loads(done.stdout)["key"]
    return key


def usage(state_url: str, name: str) -> dict[str, Any]:
    done = keys_command(state_url, "usage", name, "--json")
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)[name]
    return result
