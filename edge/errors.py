"""Every error the edge returns has OpenAI's shape: {"error": {"message", "type", "param", "code"}}, except
on the routes of another API whose clients read that API's shape (`body_of`): Anthropic's on /v1/messages...
({"type": "error", "error": {"type", "message"}}), Hugging Face TEI's on its routes ({"error",
"error_type"}). The status is the same whatever the shape.

The one table below maps service gRPC codes to HTTP; the handlers turn validation failures, a broken
request rule (`ParamError`, which the endpoint modules' rules raise), HTTP errors and anything unexpected
into the same body. Nothing else in the edge builds an error response.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from edge.state import StoreUnavailable
from tritongate.common.v1 import common_pb2
from tritongate.logs import REQUEST_ID
from tritongate.wire import CODE_KEY, PARAM_KEY, REQUEST_ID_KEY

log = logging.getLogger(__name__)

# gRPC code → (HTTP status, OpenAI error type, default OpenAI error code).
GRPC_TO_HTTP: dict[grpc.StatusCode, tuple[int, str, str | None]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error", None),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error", None),
    grpc.StatusCode.UNIMPLEMENTED: (400, "invalid_request_error", "unsupported"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error", "model_not_found"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error", None),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error", None),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error", "overloaded"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error", "service_unavailable"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error", "timeout"),
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error", "cancelled"),
}
_INTERNAL = (500, "server_error", None)
_CODES = {code.value[0]: code for code in grpc.StatusCode}  # a status code's number → the code
_HTTP_TYPES = {401: "authentication_error", 403: "permission_error", 404: "invalid_request_error",
               429: "rate_limit_error"}
ANTHROPIC_PATH = "/v1/messages"  # and the paths under it
# HTTP status → Anthropic's error type (its API reference, Errors); any other 4xx is an invalid request,
# any other 5xx an `api_error`. A service that is unavailable for a moment (503) is Anthropic's overload.
_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}


class ParamError(ValueError):
    """A request breaks a rule; `param` names the offending parameter (OpenAI's `error.param`). Raised in a
    request model's validator, it becomes a validation error that `from_validation` reads; its status is 400
    unless the rule's API says otherwise (TEI's batch limit: 413)."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status


def anthropic_route(path: str) -> bool:
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


class OpenAIError(Exception):
    """An error response in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or ("server_error" if status >= 500 else _HTTP_TYPES.get(status, "invalid_request_error"))

    def body(self, path: str = "") -> dict[str, Any]:
        """The error body for a request to `path`, in its API's shape."""
        return body_of(path)(self)

    def response(self, path: str = "") -> JSONResponse:
        return JSONResponse(self.body(path), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param, code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(404, f"The model `{model}` does not exist.", "model", "model_not_found")


def from_grpc(error: grpc.aio.AioRpcError, service: str, retry_after_s: int = 1) -> OpenAIError:
    """The one place a failed service call becomes an HTTP error (see `from_status`)."""
    pairs = cast("Iterable[tuple[str, str | bytes]]", error.trailing_metadata() or ())
    metadata = {key: value for key, value in pairs if isinstance(value, str)}
    return from_status(error.code(), error.details() or "", metadata, service, retry_after_s)


def from_item(error: common_pb2.ItemError, service: str, retry_after_s: int = 1) -> OpenAIError:
    """A failed item of a batch call (edge/coalesce.py), as the same failed unary call would be."""
    metadata = {key: value for key, value in ((PARAM_KEY, error.param), (CODE_KEY, error.error_code)) if value}
    return from_status(_CODES.get(error.code, grpc.StatusCode.UNKNOWN), error.message, metadata, service,
                       retry_after_s)


def from_status(code: grpc.StatusCode, details: str, metadata: dict[str, str], service: str,
                retry_after_s: int = 1) -> OpenAIError:
    """A service's gRPC status as an HTTP error; an overloaded service's 429 and an unavailable one's 503
    (e.g. a model instance being restarted) say when to retry (Retry-After)."""
    status, type_, default_code = GRPC_TO_HTTP.get(code, _INTERNAL)
    message = details or code.name.lower()
    if code == grpc.StatusCode.UNAVAILABLE and not metadata:
        message = f"The {service} service is unavailable; try again shortly."
    if status == 500:
        log.error("%s service failed: %s %s", service, code.name, details)
        message = f"The {service} service failed ({code.name}); see its log."
    headers = {"Retry-After": str(retry_after_s)} if status in (429, 503) else None
    return OpenAIError(status, message, metadata.get(PARAM_KEY), metadata.get(CODE_KEY, default_code), type_,
                       headers)


def _param(loc: Sequence[int | str]) -> str | None:
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    if not parts:
        return None
    text = str(parts[0])
    for part in parts[1:]:
        text += f"[{part}]" if isinstance(part, int) else f".{part}"
    return text


def _within(place: str, param: str | None) -> bool:
    """Whether a rule's `place` names `param` more exactly: a rule across fields names its own parameter
    (`param` None), and a field's rule may name a place inside the field (`input[3].content`)."""
    return param is None or place.startswith((f"{param}[", f"{param}."))


def from_validation(exc: RequestValidationError) -> OpenAIError:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "Invalid request", "type": ""}
    if first.get("type") == "json_invalid":
        return bad_request("We could not parse the JSON body of your request. (HINT: send valid JSON with "
                           "Content-Type: application/json.)")
    if first.get("type") == "missing" and tuple(first.get("loc", ())) == ("body",):
        return bad_request("The request body is missing; send a JSON object.")
    param = _param(first.get("loc", ()))
    context: Any = first.get("ctx") or {}
    rule = context.get("error")
    if isinstance(rule, ParamError) and rule.param and _within(rule.param, param):
        param = rule.param
    message = str(first.get("msg", "Invalid request"))
    if first.get("type") == "missing":
        message = f"Missing required parameter: '{param}'."
    elif first.get("type") == "value_error":  # our validators' messages already name the parameter
        message = message.removeprefix("Value error, ")
    elif param:
        message = f"Invalid value for '{param}': {message}"
    if isinstance(rule, ParamError):
        return OpenAIError(rule.status, message, param, rule.code)
    return bad_request(message, param)


def as_openai_error(exc: Exception) -> OpenAIError:
    """What the client sees for `exc`: a broken rule, a failed validation or an HTTP error as its 4xx, and
    anything unexpected (logged here) as a 500 that tells nothing of its cause."""
    if isinstance(exc, OpenAIError):
        return exc
    if isinstance(exc, ParamError):
        return OpenAIError(exc.status, exc.message, exc.param, exc.code)
    if isinstance(exc, RequestValidationError):
        return from_validation(exc)
    if isinstance(exc, StarletteHTTPException):
        message = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        return OpenAIError(exc.status_code, message)
    if isinstance(exc, StoreUnavailable):  # its message names the store (no password) and the reason
        log.warning("%s", exc)
        return OpenAIError(503, f"{exc} Try again shortly.", code="state_store_unavailable",
                           headers={"Retry-After": "1"})
    log.error("unexpected error", exc_info=exc)
    return OpenAIError(500, "The server had an error while processing your request.")


def openai_body(error: OpenAIError) -> dict[str, Any]:
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def anthropic_body(error: OpenAIError) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


# Hugging Face TEI's error body, {"error": message, "error_type": kind}: its kind of each status.
_TEI_TYPES = {401: "Unauthorized", 413: "Validation", 422: "Tokenizer", 429: "Overloaded", 503: "Unhealthy"}


def tei_body(error: OpenAIError) -> dict[str, Any]:
    kind = "Empty" if error.code == "empty" else _TEI_TYPES.get(error.status) or (
        "Backend" if error.status >= 500 else "Validation")
    return {"error": error.message, "error_type": kind}


ErrorBody = Callable[[OpenAIError], dict[str, Any]]
# The routes whose clients read another API's error body (and Anthropic's, every path under its own); a
# path shared by two APIs (/rerank, /tokenize) picks its body per request (`use_error_body`).
ERROR_BODIES: dict[str, ErrorBody] = {"/info": tei_body, "/embed": tei_body}


def body_of(path: str) -> ErrorBody:
    """The error body of the API a request to `path` speaks."""
    if anthropic_route(path):
        return anthropic_body
    return ERROR_BODIES.get(path, openai_body)


def use_error_body(request: Request, body: ErrorBody) -> None:
    request.state.error_body = body


def error_response(request: Request, exc: Exception) -> JSONResponse:
    """The response for `exc` on `request`'s route (see `as_openai_error`), in its API's error shape."""
    error = as_openai_error(exc)
    body = getattr(request.state, "error_body", None) or body_of(request.scope["path"])
    return JSONResponse(body(error), status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI) -> None:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        return error_response(request, exc)

    for kind in (OpenAIError, ParamError, RequestValidationError, StarletteHTTPException, StoreUnavailable):
        app.add_exception_handler(kind, handle)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        response = error_response(request, exc)
        # Starlette answers this one outside every middleware, so the request id is added here.
        response.headers[REQUEST_ID_KEY] = REQUEST_ID.get()
        return response
