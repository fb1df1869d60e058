"""API keys. When any are configured, every request needs `Authorization: Bearer <key>` (or Anthropic's
`x-api-key: <key>`, which the anthropic SDK and Claude Code send) except on the
open paths (health, the API docs, and /metrics unless metrics_require_key). The check denies by
default: a route added later is protected without anyone listing it, and an unknown path answers 401
before 404. Keys come from the settings (TRITONGATE_API_KEY, TRITONGATE_API_KEY_FILE: unrestricted, named
`default`) and from the shared state store (`tritongate keys create`: named, with rules; edge/keys/). No key
configured or stored: no check at all.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from edge.errors import OpenAIError, as_openai_error
from edge.keys.limits import EXTENSION, serve
from edge.keys.policy import UNRESTRICTED, KeyPolicy
from edge.keys.ring import KeyRing
from edge.routers.playground import PATHS as PLAYGROUND_PATHS
from edge.state import StoreUnavailable
from tritongate.config import ConfigError
from tritongate.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

OPEN_PATHS = frozenset({"/health", "/health/live", "/health/ready", "/v1/health/live", "/v1/health/ready",
                        "/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"}) | PLAYGROUND_PATHS
METRICS_PATH = "/metrics"
SCHEME = "ApiKey"  # the OpenAPI security scheme, so that the docs' "Authorize" button works


def parse_keys(text: str) -> list[str]:
    """Keys separated by commas; blanks around them are ignored."""
    return [key.strip() for key in text.split(",") if key.strip()]


def read_key_file(path: Path) -> list[str]:
    """One key a line; blank lines and lines starting with # are ignored."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"TRITONGATE_API_KEY_FILE: cannot read {path}: {exc}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not keys:  # fail closed: a key file was meant to turn authentication on
        raise ConfigError(f"TRITONGATE_API_KEY_FILE: {path} holds no keys")
    return keys


def load_api_keys(settings: Settings) -> list[str]:
    """Every accepted key, from api_key and api_key_file together, without duplicates."""
    keys = parse_keys(settings.api_key.get_secret_value()) if settings.api_key else []
    if settings.api_key_file is not None:
        keys += read_key_file(settings.api_key_file)
    return list(dict.fromkeys(keys))


class KeyChecker:
    """Compares a presented key with every configured one in constant time. Both sides are hashed
    first, so neither the keys' lengths nor which key matched shows in the timing."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._digests = tuple(hashlib.sha256(key.encode()).digest() for key in keys)

    def valid(self, presented: bytes) -> bool:
        digest = hashlib.sha256(presented).digest()
        found = False
        for known in self._digests:  # no early exit
            found |= hmac.compare_digest(digest, known)
        return found


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The token of an `Authorization: Bearer <token>` header, or else of an `x-api-key` header, or None."""
    api_key = None
    for name, value in headers:
        if name == b"authorization":
            scheme, _, token = value.strip().partition(b" ")
            token = token.strip()
            return token if scheme.lower() == b"bearer" and token else None
        if name == b"x-api-key":
            api_key = value.strip() or None
    return api_key


def unauthorized(message: str) -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key", type_="authentication_error",
                       headers={"WWW-Authenticate": "Bearer"})


async def _store_call(call: Awaitable[T]) -> T:
    """A store operation on the way in; a store that is down is the usual 503 naming it."""
    try:
        return await call
    except StoreUnavailable as exc:
        raise as_openai_error(exc) from None


MISSING = ("You didn't provide an API key. You need to provide your API key in an Authorization header "
           "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY), or in an x-api-key header.")
INCORRECT = "Incorrect API key provided."


class ApiKeyAuth:
    """Pure ASGI middleware (no per-request objects on the accepted path but the caller; streaming untouched).

    In an app with the edge's state (edge/app_state.py) the keys are its `KeyRing`'s: the configured ones and
    those in the state store, which can be created and revoked while the edge runs; each request is counted
    against its key's limits (429 with OpenAI's x-ratelimit-* headers), its usage is added to the key's account
    once it is answered, and its `Caller` (edge/keys/caller.py) carries the key, the priority and the model
    slots it holds. Without that state, only `keys` are accepted."""

    def __init__(self, app: ASGIApp, keys: Iterable[str], open_paths: frozenset[str]) -> None:
        self.app = app
        keys = list(keys)
        self.checker = KeyChecker(keys)
        self.configured = bool(keys)
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        state = getattr(scope["app"].state, "edge", None) if "app" in scope else None
        try:
            policy = await self._authenticate(scope, state.keys if state is not None else None)
        except OpenAIError as error:
            if scope["type"] == "websocket":
                await send({"type": "websocket.close", "code": 1008})  # policy violation
                return
            # A new response each time: outer middleware may add headers to the one it is sent.
            await error.response(scope["path"])(scope, receive, send)
            return
        scope.setdefault("state", {})["api_key"] = policy
        if scope["type"] == "websocket" or state is None:
            await self.app(scope, receive, send)
            return
        await serve(self.app, scope, receive, send, state, policy)

    async def _authenticate(self, scope: Scope, ring: KeyRing | None) -> KeyPolicy | None:
        """The caller's key policy (None: authentication is off); an OpenAIError (401, 503) when refused."""
        in_process = scope.get("extensions", {}).get(EXTENSION)
        if in_process is not None:  # only code inside this process sets scope extensions
            name = in_process.get("key_name")
            if name is None:
                return None
            policy = UNRESTRICTED if ring is None and self.configured and name == UNRESTRICTED.name else (
                await _store_call(ring.by_name(name)) if ring is not None else None)
            if policy is None:
                raise unauthorized(f"The key {name!r} is revoked or unknown.")
            return policy
        token = presented_key(scope["headers"])
        if ring is None:
            if not self.configured:
                return None
            if token is not None and self.checker.valid(token):
                return UNRESTRICTED
            raise unauthorized(MISSING if token is None else INCORRECT)
        if not await _store_call(ring.required()):
            return None
        if token is None:
            raise unauthorized(MISSING)
        policy = await _store_call(ring.lookup(token))
        if policy is None:
            raise unauthorized(INCORRECT)
        return policy


def open_paths(settings: Settings) -> frozenset[str]:
    return OPEN_PATHS if settings.metrics_require_key else OPEN_PATHS | {METRICS_PATH}


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _document_bearer(app: FastAPI, unprotected: frozenset[str]) -> None:
    """Declare the bearer scheme on every protected operation of the OpenAPI document."""
    build: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        documented = app.openapi_schema is not None
        schema = build()  # FastAPI builds the document once and caches it in app.openapi_schema
        if not documented:
            schema.setdefault("components", {}).setdefault("securitySchemes", {})[SCHEME] = {
                "type": "http", "scheme": "bearer"}
            for path, operations in schema.get("paths", {}).items():
                if path not in unprotected:
                    for operation in operations.values():
                        operation["security"] = [{SCHEME: []}]
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def install_auth(app: FastAPI, settings: Settings) -> None:
    """Require a key when any is configured or stored (`tritongate keys create`); add before the outermost
    (metrics) middleware. The middleware is always there: keys may be created while the edge runs."""
    keys = load_api_keys(settings)
    unprotected = open_paths(settings)
    app.add_middleware(ApiKeyAuth, keys=keys, open_paths=unprotected)
    if not keys:
        if not _is_loopback(settings.edge_host):
            log.warning("no API key configured: unless keys are created with `tritongate keys create`, anyone who "
                        "reaches %s:%d can use the API (set TRITONGATE_API_KEY or --api-key)", settings.edge_host,
                        settings.edge_port)
        return
    _document_bearer(app, unprotected)
    log.info("API keys: %d configured; open without one: %s", len(keys), ", ".join(sorted(unprotected)))
