"""How many processes each component runs, and how they share the work.

`tritongate up --workers auto` (the default) starts as many edge workers and service replicas as the
machine's cores call for; `--workers 1` is one process per component. Edge workers share one port
(SO_REUSEPORT: the kernel spreads connections over them) and one prometheus-client multiprocess
directory (each worker's /metrics reports the sum of all). Service replicas listen on ports
REPLICA_PORT_STEP apart, and the edge's channel balances over them (round_robin over an `ipv4:` list of
addresses), as it does over the replicas a DNS name resolves to in a deployment.

A worker that exits is restarted (launcher/supervisor.py), and its gauges leave the shared metrics.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable

from launcher.supervisor import CannotStart, Process, Supervisor
from tritongate.settings import auto_workers

AUTO = "auto"
REPLICA_PORT_STEP = 100  # replica i of a service listens on its port + i * 100 (50052, 50152, ...)
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's multiprocess mode


def parse_workers(value: str) -> int:
    """`auto` or a count ≥ 1 (argparse type)."""
    if value == AUTO:
        return auto_workers()
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise ValueError(f"expected `auto` or a number of processes ≥ 1, got {value!r}")
    return count


def replica_ports(port: int, replicas: int) -> list[int]:
    return [port + i * REPLICA_PORT_STEP for i in range(replicas)]


def replicas_target(host: str, ports: list[int]) -> str:
    """A gRPC target for every replica: host:port for one, else an `ipv4:`/`ipv6:` address list (gRPC's
    round_robin balances over the addresses a target resolves to)."""
    if len(ports) == 1:
        return f"{host}:{ports[0]}"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        address = ipaddress.ip_address(socket.gethostbyname(host))
    if address.is_unspecified:  # listening on every interface: reach it on loopback
        address = ipaddress.ip_address("::1" if address.version == 6 else "127.0.0.1")
    if address.version == 6:
        return "ipv6:" + ",".join(f"[{address}]:{port}" for port in ports)
    return "ipv4:" + ",".join(f"{address}:{port}" for port in ports)


def shared_port_socket(host: str, port: int) -> socket.socket:
    """A listening socket that other processes bind too (SO_REUSEPORT); CannotStart when the port is taken
    (by a process that does not share it) or the address is not this host's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise CannotStart(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def forget_worker_metrics(metrics_dir: str) -> Callable[[Process], str]:
    """What to do after an edge worker exits: its live gauges (requests in progress) leave the metrics
    that the other workers report."""
    from prometheus_client import multiprocess

    def forget(process: Process) -> str:
        multiprocess.mark_process_dead(process.pid, metrics_dir)
        return ""

    return forget


def run_edge_workers(argv: list[str], workers: int, grace_s: float) -> int:
    """`tritongate edge --workers N`: N edge processes on one port, a worker that exits restarted, all
    stopped together on SIGINT or SIGTERM (returns 0 then; each drains for up to `grace_s`). A worker that
    cannot start raises CannotStart."""
    from tritongate.triton_local import stop_on_signals

    with tempfile.TemporaryDirectory(prefix="tritongate-edge-metrics-") as metrics_dir:
        env = dict(os.environ)
        env.setdefault(METRICS_DIR_ENV, metrics_dir)
        command = [sys.executable, "-m", "launcher.cli", *argv, "--workers", "1", "--shared-port"]
        supervisor = Supervisor()
        stopping = stop_on_signals()
        try:
            for i in range(workers):
                supervisor.add(f"edge-{i + 1}", lambda: subprocess.Popen(command, env=env),
                               forget_worker_metrics(env[METRICS_DIR_ENV]))
            supervisor.watch(stopping)
        finally:
            supervisor.stop(grace_s + 5)
        return 0
