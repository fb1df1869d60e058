"""Health: GET /health (each service's gRPC health as detail), and Kubernetes-style probes:
/health/live (the edge process answers) and /health/ready (at least one service is serving), with
NVIDIA NIM's /v1/health/live and /v1/health/ready as aliases.

/health and /health/ready answer 503 while no service is serving, so that a load balancer or a
readiness probe keeps traffic away from an edge that could only refuse it; liveness never depends on
the services (restarting the edge would not bring them back).
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import grpc
import orjson
from fastapi import Request, Response
from grpc_health.v1 import health_pb2, health_pb2_grpc
from pydantic import BaseModel

from edge.api_router import api_router
from edge.app_state import edge_state

router = api_router(tags=["health"])

SERVING = "serving"


class Health(BaseModel):
    status: Literal["ok", "unavailable"]  # unavailable (with a 503) while no service is serving
    services: dict[str, str]  # service name → serving, not_serving, unknown, service_unknown or unavailable


class Live(BaseModel):
    status: Literal["ok"]


# 503: the same body, saying which services are not serving.
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "At least one service is serving"},
    503: {"model": Health, "description": "No service is serving"},
}


async def _service_status(channel: grpc.aio.Channel) -> str:
    try:
        response = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
    except grpc.aio.AioRpcError:
        return "unavailable"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)).lower()


@router.get("/health", responses=HEALTH_RESPONSES)
@router.get("/health/ready", responses=HEALTH_RESPONSES)
@router.get("/v1/health/ready", responses=HEALTH_RESPONSES)
async def health(request: Request) -> Response:
    clients = edge_state(request).clients
    statuses = await asyncio.gather(*(_service_status(client.channel) for client in clients.all))
    services = {c.service.name: s for c, s in zip(clients.all, statuses, strict=True)}
    ready = SERVING in statuses
    body = Health(status="ok" if ready else "unavailable", services=services)
    return Response(orjson.dumps(body.model_dump()), status_code=200 if ready else 503,
                    media_type="application/json")


@router.get("/health/live", response_model=Live)
@router.get("/v1/health/live", response_model=Live)
async def live() -> Live:
    return Live(status="ok")
