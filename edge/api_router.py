"""What every router of the edge shares: strict JSON request bodies, and the responses that
/openapi.json declares for every operation (the errors, and each operation's 200).

Request bodies are parsed with orjson, which accepts only strict JSON. Python's `json` lets through what
no JSON client should send and what the services cannot carry: lone UTF-16 surrogates (`"\\udb03"`,
which cannot be encoded to the UTF-8 that protobuf requires) and `NaN` / `Infinity`. orjson refuses
them, and FastAPI turns its error (a `json.JSONDecodeError`) into the usual 400 "could not parse the
JSON body". It is also faster.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any, Literal

import orjson
from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict


class ErrorObject(BaseModel):
    model_config = ConfigDict(extra="forbid")

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(BaseModel):
    """OpenAI's error body, which every error of the edge has (FastAPI's 422 `detail` never appears)."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorObject


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    "4XX": {"model": ErrorResponse, "description": "The request was refused (400 invalid, 401, 404 unknown "
                                                   "model, 413 too large, 429 overloaded)"},
    "5XX": {"model": ErrorResponse, "description": "A service failed (500), is unavailable (503) or timed out "
                                                   "(504)"},
}


class TEIErrorResponse(BaseModel):
    """Hugging Face TEI's error body, which its routes answer (edge/errors.py)."""

    model_config = ConfigDict(extra="forbid")

    error: str
    error_type: Literal["Empty", "Validation", "Tokenizer", "Overloaded", "Unhealthy", "Backend", "Unauthorized"]


def errors_of(model: Any) -> dict[int | str, dict[str, Any]]:
    """ERROR_RESPONSES with another error body: TEI's routes', or a route's shared by two APIs."""
    return {status: {**response, "model": model} for status, response in ERROR_RESPONSES.items()}


TEI_ERRORS = errors_of(TEIErrorResponse)
EITHER_ERRORS = errors_of(ErrorResponse | TEIErrorResponse)  # /rerank and /tokenize: by the body's API
# For the generation endpoints: with `stream: true` the answer is Server-Sent Events. (In OpenAPI 3.1 the
# schema of an event stream describes one event: `data` is a chunk's JSON, or `[DONE]` last.)
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}


def ok(model: Any, description: str = "Successful Response") -> dict[int | str, dict[str, Any]]:
    """The 200 response of an operation that writes its JSON itself: `model` declares its schema."""
    return {200: {"model": model, "description": description}}


def ok_or_stream(model: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The 200 response of a generation endpoint: `model`, or with `stream: true` `chunk`s as events."""
    return {200: {"model": model, "content": {"text/event-stream": {"schema": SSE_EVENT}},
                  "description": f"A {model.__name__}, or with `stream: true` Server-Sent Events whose `data` is "
                                 f"a {chunk.__name__} (then `[DONE]`)"}}


class StrictJSONRequest(Request):
    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = orjson.loads(await self.body())
        return self._json


class StrictJSONRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def strict(request: Request) -> Response:
            return await handler(StrictJSONRequest(request.scope, request.receive))

        return strict


def api_router(errors: dict[int | str, dict[str, Any]] = ERROR_RESPONSES, **kwargs: Any) -> APIRouter:
    """An APIRouter with strict JSON bodies and its error responses declared (OpenAI's unless `errors`)."""
    return APIRouter(route_class=StrictJSONRoute, responses=errors, **kwargs)
