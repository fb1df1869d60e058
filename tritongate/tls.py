"""TLS for the internal gRPC channels (edge → services, and the health probes), off by default.

Services serve with a certificate and key; clients verify them against a CA. One place builds the
credentials so that the edge, `tritongate health` and `tritongate up` agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tritongate.config import ConfigError
from tritongate.settings import Settings


def _read(path: Path, setting: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{setting}: cannot read {path}: {exc.strerror or exc}") from None


def server_credentials(settings: Settings) -> grpc.ServerCredentials | None:
    """A service's credentials from grpc_tls_cert + grpc_tls_key; None (plaintext) when neither is set."""
    cert, key = settings.grpc_tls_cert, settings.grpc_tls_key
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("TRITONGATE_GRPC_TLS_CERT and TRITONGATE_GRPC_TLS_KEY must be set together")
    return grpc.ssl_server_credentials([(_read(key, "TRITONGATE_GRPC_TLS_KEY"),
                                         _read(cert, "TRITONGATE_GRPC_TLS_CERT"))])


@dataclass(frozen=True)
class ClientTls:
    """What a client channel needs to reach a TLS service."""

    credentials: grpc.ChannelCredentials
    options: tuple[tuple[str, Any], ...] = ()


def client_tls(settings: Settings) -> ClientTls | None:
    """From grpc_tls_ca (+ grpc_tls_server_name); None (plaintext) when no CA is set."""
    if settings.grpc_tls_ca is None:
        return None
    credentials = grpc.ssl_channel_credentials(root_certificates=_read(settings.grpc_tls_ca, "TRITONGATE_GRPC_TLS_CA"))
    name = settings.grpc_tls_server_name
    # The name checked against the certificate; without it, the target's host (wrong for IP targets).
    return ClientTls(credentials, (("grpc.ssl_target_name_override", name),) if name else ())


def sync_channel(target: str, tls: ClientTls | None) -> grpc.Channel:
    """A blocking channel for probes."""
    if tls is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, tls.credentials, options=list(tls.options))
