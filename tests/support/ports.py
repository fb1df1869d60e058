"""Free loopback ports, and waiting until something is ready."""

from __future__ import annotations

import random
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def _ephemeral_start() -> int:
    """Where the kernel's range of ports for outgoing connections starts."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


_EPHEMERAL_START = _ephemeral_start()
_given: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now, never the same twice in this process, and below the kernel's
    range for outgoing connections: a port from that range (what binding port 0 gives) can be taken by a
    client's connection before the server it was meant for binds it, and the stack then fails to start.
    Room is left above it for replicas (launcher/workers.py: a service's port + i * 100)."""
    for _ in range(1000):
        port = random.randrange(10_000, _EPHEMERAL_START - 1_000)
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError("no free loopback port found")


def wait_until(check: Callable[[], object], timeout: float, what: str,
               process: subprocess.Popen[bytes] | None = None) -> None:
    """Poll `check` until it is true; fail when `timeout` s pass first, or when `process` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with code {process.returncode}")
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"{what} not ready after {timeout} s")
