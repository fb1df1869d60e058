"""The edge's gRPC channels to the services: each balances over every address its target resolves to
(round_robin), re-resolves DNS often so that new replicas are found, retries idempotent calls on
UNAVAILABLE, and comes back quickly when a service does. The app's lifespan opens them
(edge/clients.py `ServiceClients`)."""

from __future__ import annotations

import json
from typing import Any

import grpc

from tritongate.registry import ServiceInfo
from tritongate.tls import ClientTls
from tritongate.wire import MAX_MESSAGE_BYTES

# How long a channel can wait to try a service again: a service that is back may be refused that long.
MAX_RECONNECT_BACKOFF_MS = 2000


def _service_config(service: ServiceInfo) -> str:
    retry = {
        "maxAttempts": 4,
        "initialBackoff": "0.05s",
        "maxBackoff": "1s",
        "backoffMultiplier": 2,
        "retryableStatusCodes": ["UNAVAILABLE"],
    }
    return json.dumps({
        "loadBalancingConfig": [{"round_robin": {}}],
        "methodConfig": [{"name": [{"service": service.grpc_service, "method": m} for m in service.idempotent],
                          "retryPolicy": retry}],
    })


def open_channel(target: str, service: ServiceInfo, tls: ClientTls | None = None) -> grpc.aio.Channel:
    """A channel to one service; over TLS when `tls` is given."""
    options: list[tuple[str, Any]] = [
        ("grpc.service_config", _service_config(service)),
        ("grpc.enable_retries", 1),
        ("grpc.dns_min_time_between_resolutions_ms", 1000),
        # A request larger than this is not kept for a retry (default 256 KiB: a big embedding batch).
        ("grpc.per_rpc_retry_buffer_size", 16 * 1024 * 1024),
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.keepalive_time_ms", 20_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        # The default reconnect backoff grows to 120 s: a service that comes back would go unnoticed that long.
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.min_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
    ]
    if tls is not None:
        return grpc.aio.secure_channel(target, tls.credentials, options=[*options, *tls.options])
    return grpc.aio.insecure_channel(target, options=options)
