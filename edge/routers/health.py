"""GET /health: the edge is up; each service's gRPC health as detail."""

from __future__ import annotations

import asyncio
from typing import Literal

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

from edge.api_router import api_router
from edge.deps import ClientsDep

router = api_router()


class Health(BaseModel):
    status: Literal["ok"]
    services: dict[str, str]  # service name → serving, not_serving, unknown, service_unknown or unavailable


async def _service_status(channel: grpc.aio.Channel) -> str:
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.aio.AioRpcError:
        return "unavailable"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)).lower()


@router.get("/health", tags=["health"], response_model=Health)
async def health(clients: ClientsDep) -> Health:
    statuses = await asyncio.gather(*(_service_status(client.channel) for client in clients.all))
    return Health(status="ok", services={c.service.name: s for c, s in zip(clients.all, statuses, strict=True)})
