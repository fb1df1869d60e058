"""Free loopback ports, and waiting until something is ready."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
