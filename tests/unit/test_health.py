"""The edge's health endpoints with no service reachable (the e2e tests see them with every service up)."""

from __future__ import annotations

from fastapi.testclient import TestClient

from edge.app import create_app
from tests.support.ports import free_port
from tritongate.settings import Settings


def _edge_without_services(**settings: str) -> TestClient:
    nowhere = {f"{name}_target": f"127.0.0.1:{free_port()}" for name in ("llm", "embed", "rerank")}
    return TestClient(create_app(Settings(**nowhere, **settings)))


def test_no_service_serving_makes_the_edge_unready_but_alive() -> None:
    with _edge_without_services() as client:
        for path in ("/health", "/health/ready", "/v1/health/ready"):
            response = client.get(path)
            assert response.status_code == 503, path
            assert response.json() == {"status": "unavailable", "services": {
                "llm": "unavailable", "embed": "unavailable", "rerank": "unavailable"}}
        for path in ("/health/live", "/v1/health/live"):
            assert client.get(path).json() == {"status": "ok"}


def test_probes_need_no_api_key() -> None:
    with _edge_without_services(api_key="secret") as client:
        assert client.get("/health/live").status_code == 200
        assert client.get("/v1/health/ready").status_code == 503
        assert client.get("/v1/models").status_code == 401
