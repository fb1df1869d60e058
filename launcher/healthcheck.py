"""`tritongate health`: one probe for container health checks, and for `LocalStack`'s readiness checks.
A service is healthy when its gRPC health service answers SERVING, the edge when GET /health answers 200.
A service's name (any entry of tritongate/registry.py) stands for its port on this host."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import TYPE_CHECKING

from tritongate.registry import BY_NAME
from tritongate.settings import Settings

if TYPE_CHECKING:  # tritongate.tls and grpc_health are imported only for gRPC probes
    from tritongate.tls import ClientTls

_WILDCARDS = ("", "0.0.0.0", "::", "[::]")


def _local(host: str) -> str:
    return "127.0.0.1" if host in _WILDCARDS else host


def resolve(target: str, settings: Settings) -> str:
    """A component name becomes its address on this host (from the same settings it listens on)."""
    if target == "edge":
        return f"http://{_local(settings.edge_host)}:{settings.edge_port}/health"
    if target in BY_NAME:
        return f"{_local(settings.service_host)}:{settings.port(target)}"
    return target


def probe(target: str, timeout: float, tls: ClientTls | None = None) -> tuple[bool, str]:
    """(healthy, what was seen) for a gRPC address (over TLS when `tls` is given) or an http(s) URL."""
    if target.startswith(("http://", "https://")):
        try:
            with urllib.request.urlopen(target, timeout=timeout) as response:
                return response.status == 200, f"HTTP {response.status}"
        except urllib.error.HTTPError as exc:
            return False, f"HTTP {exc.code}"
        except (urllib.error.URLError, OSError) as exc:
            return False, f"unreachable: {exc}"

    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tritongate.tls import sync_channel

    with sync_channel(target, tls) as channel:
        try:
            response = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            return False, f"unreachable: {exc.code().name}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    return response.status == health_pb2.HealthCheckResponse.SERVING, status
