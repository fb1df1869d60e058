"""Lean routes (edge/lean.py): a valid JSON body is served straight, without FastAPI's router; anything else
goes to FastAPI with its body replayed, so its errors are FastAPI's own; the endpoint's errors are mapped as
the app's exception handlers map them; either way the body is validated with the edge's per-request limits."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Self

import orjson
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationInfo, model_validator

from edge.app_state import RequestLimits, limits_of
from edge.endpoints.common import check_count
from edge.errors import ParamError, install_error_handlers
from edge.lean import LeanRoutes, lean_router


class Body(BaseModel):
    model: str
    n: int = 1
    inputs: list[str] = []

    @model_validator(mode="after")
    def _within_limit(self, info: ValidationInfo) -> Self:
        check_count(len(self.inputs), limits_of(info).max_embedding_inputs, "inputs")
        return self


def app_with_lean_route() -> tuple[FastAPI, list[str]]:
    """An app with one lean route; the list records which way each request went."""
    ways: list[str] = []
    router = lean_router()

    @router.post("/v1/thing")
    async def thing(body: Body, request: Request) -> Response:
        ways.append("endpoint")
        if body.n > 3:
            raise ParamError("`n` is at most 3.", "n")
        return Response(orjson.dumps({"model": body.model, "n": body.n, "path": request.url.path}),
                        media_type="application/json")

    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)

    class Recorder:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                ways.append("fastapi")
            await self.inner(scope, receive, send)

    app.add_middleware(Recorder)
    app.add_middleware(LeanRoutes, routers=(router,))
    return app, ways


def test_a_valid_body_is_served_without_fastapis_router() -> None:
    app, ways = app_with_lean_route()
    with TestClient(app) as client:
        response = client.post("/v1/thing", json={"model": "m", "n": 2})
    assert response.status_code == 200
    assert response.json() == {"model": "m", "n": 2, "path": "/v1/thing"}
    assert ways == ["endpoint"]


def test_an_invalid_body_gets_fastapis_own_error_from_the_replayed_body() -> None:
    app, ways = app_with_lean_route()
    with TestClient(app) as client:
        wrong_type = client.post("/v1/thing", json={"model": "m", "n": "many"})
        not_json = client.post("/v1/thing", content=b"{", headers={"Content-Type": "application/json"})
        missing = client.post("/v1/thing", json={"n": 1})
    assert wrong_type.status_code == not_json.status_code == missing.status_code == 400
    assert wrong_type.json()["error"]["param"] == "n"
    assert "parse the JSON body" in not_json.json()["error"]["message"]
    assert missing.json()["error"] == {"message": "Missing required parameter: 'model'.",
                                       "type": "invalid_request_error", "param": "model", "code": None}
    assert ways == ["fastapi", "fastapi", "fastapi"]  # and FastAPI never reached the endpoint


def test_another_content_type_goes_to_fastapi_which_serves_it_the_same() -> None:
    app, ways = app_with_lean_route()
    with TestClient(app) as client:
        response = client.post("/v1/thing", content=orjson.dumps({"model": "m"}),
                               headers={"Content-Type": "application/merge-patch+json"})
    assert response.status_code == 200 and response.json()["model"] == "m"
    assert ways == ["fastapi", "endpoint"]


def test_an_endpoint_error_is_mapped_as_the_exception_handlers_map_it() -> None:
    app, ways = app_with_lean_route()
    with TestClient(app) as client:
        response = client.post("/v1/thing", json={"model": "m", "n": 4})
    assert response.status_code == 400
    assert response.json()["error"] == {"message": "`n` is at most 3.", "type": "invalid_request_error",
                                        "param": "n", "code": None}
    assert ways == ["endpoint"]


def test_either_way_the_body_is_validated_with_the_edges_limits() -> None:
    """FastAPI validates a body without the edge's limits: on that way the endpoint gets it validated again,
    with them, so a body over a limit is refused the same whichever way it comes."""
    app, ways = app_with_lean_route()
    app.state.edge = SimpleNamespace(limits=RequestLimits(max_embedding_inputs=2, max_rerank_documents=1))
    over = orjson.dumps({"model": "m", "inputs": ["a", "b", "c"]})
    with TestClient(app) as client:
        lean = client.post("/v1/thing", content=over, headers={"Content-Type": "application/json"})
        fastapi = client.post("/v1/thing", content=over, headers={"Content-Type": "application/merge-patch+json"})
        within = client.post("/v1/thing", json={"model": "m", "inputs": ["a", "b"]})
    assert lean.status_code == fastapi.status_code == 400
    assert lean.json() == fastapi.json() == {"error": {
        "message": "'inputs' has 3 items; at most 2 are allowed.", "type": "invalid_request_error",
        "param": "inputs", "code": None}}
    assert within.status_code == 200
    assert ways == ["fastapi", "fastapi", "endpoint"]  # the lean way replayed the refused body to FastAPI
