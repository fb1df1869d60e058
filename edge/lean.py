"""Lean routes: every route that takes a JSON body, without FastAPI's per-request machinery.

FastAPI spends more CPU on a small request than the rest of the edge does: the router's search through
every route, two exception and exit-stack middlewares, dependency resolution, its content-type parsing.
A `LeanRoute`'s endpoint takes only `(body, request)` and reads what it needs from the edge's state
(edge/app_state.py), so `LeanRoutes`, the innermost middleware, can serve it straight: exact path, a JSON
body that parses and validates, the endpoint, its answer. The route stays an ordinary FastAPI route for
/openapi.json and for everything else.

Anything off that path goes to FastAPI unchanged, the body replayed: a body that is not JSON, does not
parse or does not validate gets FastAPI's own errors (edge/errors.py), so the error bodies are the same
whichever way a request goes. An error the endpoint raises becomes its response through the same
mapping the app's exception handlers use.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import orjson
from fastapi import APIRouter, Request, Response
from pydantic import TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.api_router import ERROR_RESPONSES, StrictJSONRoute
from edge.errors import error_response

Endpoint = Callable[[Any, Request], Coroutine[Any, Any, Response]]
_JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")


class LeanRoute(StrictJSONRoute):
    """A route whose endpoint is `async def endpoint(body: <type>, request: Request) -> Response`."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(path, endpoint, **kwargs)
        hints = typing.get_type_hints(endpoint, include_extras=True)
        if list(hints) != ["body", "request", "return"]:
            raise TypeError(f"{endpoint.__name__}: a lean endpoint takes (body, request) and nothing else")
        self.body = TypeAdapter(hints["body"])
        self.lean_endpoint: Endpoint = endpoint


def lean_router(errors: dict[int | str, dict[str, Any]] = ERROR_RESPONSES, **kwargs: Any) -> APIRouter:
    """An APIRouter of lean routes, with its error responses declared (OpenAI's unless `errors`, as
    `api_router`)."""
    return APIRouter(route_class=LeanRoute, responses=errors, **kwargs)


def _json_body(scope: Scope) -> bool:
    """The Content-Type of a body FastAPI would parse as JSON, in the forms clients send it."""
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.lower() in _JSON_TYPES
    return False


class LeanRoutes:
    """Serves the lean routes of `routers` (included in the app without a prefix) straight; every other
    request goes to `app` (FastAPI's router)."""

    def __init__(self, app: ASGIApp, routers: Iterable[APIRouter]) -> None:
        self.app = app
        self.routes = {(method, route.path): route for router in routers for route in router.routes
                       if isinstance(route, LeanRoute) for method in route.methods or ()}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get((scope["method"], scope["path"])) if scope["type"] == "http" else None
        if route is None or not _json_body(scope):
            await self.app(scope, receive, send)
            return
        body = await _read(receive)
        try:
            value = route.body.validate_python(orjson.loads(body))
        except (orjson.JSONDecodeError, ValidationError):
            await self.app(scope, _replay(body, receive), send)  # FastAPI's own error for it
            return
        scope["route"] = route  # as the router sets it: the metrics' and the access log's route label
        request = Request(scope, receive)
        request._body = body  # read already
        try:
            response = await route.lean_endpoint(value, request)
        except Exception as exc:  # mapped as the app's exception handlers map it
            response = error_response(request, exc)
        await response(scope, receive, send)


async def _read(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """`receive` with the body that was already read first."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
