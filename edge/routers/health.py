"""GET /health: the edge is up; each service's gRPC health as detail."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
from fastapi import Request
from grpc_health.v1 import health_pb2, health_pb2_grpc

from edge.routing import api_router

router = api_router()


async def _service_status(channel: grpc.aio.Channel) -> str:
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.aio.AioRpcError:
        return "unavailable"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)).lower()


@router.get("/health", tags=["health"])
async def health(request: Request) -> dict[str, Any]:
    backends = request.app.state.backends
    statuses = await asyncio.gather(*(_service_status(b.channel) for b in backends.values()))
    return {"status": "ok", "services": {b.name: s for b, s in zip(backends.values(), statuses, strict=True)}}
