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

Every body is validated with the edge's per-request limits as pydantic's validation context
(`RequestLimits`, edge/app_state.py), so that a request model's validators check them and converting a
validated request cannot fail.

Every endpoint runs until the client disconnects, whichever way it came (vLLM calls this
`with_cancellation`): while the edge waits for a service nobody reads the HTTP connection, so a client that
goes away would go unnoticed until the answer is ready. `until_disconnected` races the endpoint against the
disconnect: the loser is cancelled, and cancelling the gRPC call cancels the service's work and its Triton
request. `cancelled_on_disconnect` is the watch itself, which a streamed answer keeps while it streams
(edge/sse.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import typing
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.api_router import ERROR_RESPONSES, StrictJSONRoute
from edge.app_state import validation_context
from edge.errors import OpenAIError, error_response

Endpoint = Callable[[Any, Request], Coroutine[Any, Any, Response]]
T = TypeVar("T")
Model = TypeVar("Model", bound=BaseModel)
_JSON_TYPES = (b"application/json", b"application/json; charset=utf-8")


class LeanRoute(StrictJSONRoute):
    """A route whose endpoint is `async def endpoint(body: <type>, request: Request) -> Response`. Its body is
    validated with the edge's per-request limits (pydantic's validation context) whichever way it comes:
    FastAPI validates it without them, so on that way the endpoint gets it validated again, with them."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        hints = typing.get_type_hints(endpoint, include_extras=True)
        if list(hints) != ["body", "request", "return"]:
            raise TypeError(f"{endpoint.__name__}: a lean endpoint takes (body, request) and nothing else")
        self.body = TypeAdapter(hints["body"])
        self.lean_endpoint: Endpoint = endpoint

        async def with_limits(body: Any, request: Request) -> Response:
            return await until_disconnected(request, endpoint(
                validated(self.body.validate_python, await request.json(), request), request))

        functools.update_wrapper(with_limits, endpoint)  # FastAPI reads the signature, name and docstring
        with_limits.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=hints[name])
             for name in ("body", "request")], return_annotation=hints["return"])
        super().__init__(path, with_limits, **kwargs)


def validated(validate: Callable[..., T], value: Any, request: Request) -> T:
    """`value` validated by `validate` (a model's or a type adapter's) with the edge's per-request limits;
    a failure raised as FastAPI's own validation of a declared body raises it."""
    try:
        return validate(value, context=validation_context(request))
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        raise RequestValidationError(errors, body=value) from None


def parse_body(model: type[Model], body: Any, request: Request) -> Model:
    """`body` as `model`, validated as a lean route's body is (for a route whose body is one of several
    APIs', told apart by its fields)."""
    return validated(model.model_validate, body, request)


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
        request = Request(scope, receive)
        try:
            value = route.body.validate_python(orjson.loads(body), context=validation_context(request))
        except (orjson.JSONDecodeError, ValidationError):
            await self.app(scope, _replay(body, receive), send)  # FastAPI's own error for it
            return
        scope["route"] = route  # as the router sets it: the metrics' and the access log's route label
        request._body = body  # read already
        try:
            response = await until_disconnected(request, route.lean_endpoint(value, request))
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


@contextlib.contextmanager
def cancelled_on_disconnect(receive: Receive) -> Iterator[Callable[[], bool]]:
    """Inside the block, the current task is cancelled when the client disconnects (once the request's
    body has been read). Yields `disconnected()`, for an `except CancelledError`: True when the
    cancellation came from the client's disconnect, which it then ends (the task is not cancelled any
    more); False for any other cancellation. The work stays in the request's own task: one watcher
    task, no wait set."""
    task = asyncio.current_task()
    assert task is not None
    watching = True

    def on_disconnect(watcher: asyncio.Future[None]) -> None:
        if watching and not watcher.cancelled():
            task.cancel()

    watcher = asyncio.ensure_future(_disconnected(receive))
    watcher.add_done_callback(on_disconnect)

    def ours() -> bool:
        if watcher.done() and not watcher.cancelled():
            task.uncancel()
            return True
        return False

    try:
        yield ours
    finally:
        watching = False
        watcher.cancel()


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the client disconnects first (then a 499 nobody reads)."""
    with cancelled_on_disconnect(request.receive) as disconnected:
        try:
            return await work
        except asyncio.CancelledError:
            if disconnected():  # it ends here, as a 499
                raise OpenAIError(499, "The client closed the request.", code="cancelled") from None
            raise


async def _disconnected(receive: Receive) -> None:
    # The body has been read: the next message is the disconnect.
    while (await receive())["type"] != "http.disconnect":
        pass
