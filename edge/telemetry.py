"""The edge's per-request bookkeeping, in one outermost ASGI middleware: the request id (`X-Request-ID`,
taken from the client when sane, else made up, and sent back), where the request's time went
(`Server-Timing`), Prometheus metrics at GET /metrics, and one access-log line per request.

Metrics: HTTP requests by route, model and status, their latency (to the last byte, so a stream counts
whole), requests in progress, the time in each stage (`STAGES`); for generation, time to first token,
time between streamed deltas, and tokens in and out by model.

What the edge learns on the way goes on the request's `Exchange`, which `current()` returns anywhere in
the request's tasks: the service clients (edge/clients.py) record the model, the usage and the stage
timings of every call they make, in one place; the coalescer its hold.

Stages: `hold` (in the edge's coalescer, edge/coalesce.py, until the request's call left), then the
service's `tokenization`, `queue` (its batcher) and `inference`, as the service reports them
(`common.v1.Timings`); `ttft` (from arrival to the first generated delta) and `total` (from arrival to
the response's headers, for a response complete by then). The `Server-Timing` header (W3C; browsers'
developer tools show it) carries those known when the response starts: a stream's headers go out before
its first token, so a stream's header holds only what came before (its tokenization); the access-log line
and the histograms, written at the end, have all of them.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from contextvars import ContextVar
from dataclasses import dataclass

from fastapi import FastAPI
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tritongate.common.v1 import common_pb2
from tritongate.logs import REQUEST_ID, bind_request_id, new_request_id, sane_request_id
from tritongate.wire import REQUEST_ID_KEY

_SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
REQUESTS = Counter("http_requests_total", "HTTP requests answered, by route template, model and status.",
                   ("method", "route", "model", "status"))
LATENCY = Histogram("http_request_duration_seconds", "Time from a request to the last byte of its response.",
                    ("method", "route", "model"), buckets=_SECONDS)
IN_PROGRESS = Gauge("http_requests_in_progress", "HTTP requests being answered now.", ("method",),
                    multiprocess_mode="livesum")  # with several edge workers: the sum over the live ones
TTFT = Histogram("tritongate_time_to_first_token_seconds",
                 "Time from a generation request's arrival to its first generated text.", ("model",),
                 buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 30, 60))
INTER_TOKEN = Histogram("tritongate_inter_token_latency_seconds",
                        "Time between consecutive deltas of a generation (a delta may hold several tokens).",
                        ("model",), buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
TOKENS = Counter("tritongate_tokens_total", "Tokens processed, by model and kind (prompt or completion).",
                 ("model", "kind"))
STAGES = ("hold", "tokenization", "queue", "inference")  # in the order a request goes through them
TIMINGS = (*STAGES, "ttft", "total")  # what Server-Timing and the access log show, in this order
# A JSON access line has every one's field, None when not measured (the total is `duration_ms`).
_LOG_FIELDS = [f"{name}_ms" for name in TIMINGS[:-1]]
STAGE_LATENCY = Histogram("tritongate_request_stage_seconds",
                          "Time a request spent in each stage (hold, tokenization, queue, inference) that its path "
                          "has, by model.", ("model", "stage"),
                          buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                   1, 2.5, 5, 10, 30, 60, 300))
_stage_series = functools.cache(STAGE_LATENCY.labels)  # (model, stage): a served model's, so bounded
# Usage by key name (never the key itself) and model.
KEY_REQUESTS = Counter("tritongate_key_requests_total", "Requests served to a model, by key name and model.",
                       ("key", "model"))
KEY_TOKENS = Counter("tritongate_key_tokens_total",
                     "Tokens by key name, model and kind (prompt, completion, or cached: of prompt, those cached).",
                     ("key", "model", "kind"))

UNMATCHED = "unmatched"  # any path no route serves: one label value, however many paths clients try
QUIET_ROUTES = frozenset({"/health", "/health/live", "/health/ready", "/v1/health/live", "/v1/health/ready",
                          "/metrics"})  # probes and scrapes: access-logged at DEBUG only
access_log = logging.getLogger("tritongate.access")


@dataclass(slots=True)
class Exchange:
    """What the edge learns about one request while serving it."""

    request_id: str
    start: float
    model: str = ""  # set by the service client once the model is found, so labels are only served models
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    # Stages, in seconds; None for one the request's path does not have (or has not reached yet).
    hold: float | None = None
    tokenization: float | None = None
    queue: float | None = None
    inference: float | None = None
    ttft: float | None = None

    def record_usage(self, usage: common_pb2.Usage, completion: bool = False) -> None:
        self.prompt_tokens = usage.prompt_tokens
        self.cached_tokens = usage.cached_tokens
        if completion:
            self.completion_tokens = usage.completion_tokens

    def record_timings(self, timings: common_pb2.Timings) -> None:
        """The stages a service reports (those it leaves unset keep what was known)."""
        if timings.HasField("queue_s"):
            self.queue = timings.queue_s
        if timings.HasField("tokenization_s"):
            self.tokenization = timings.tokenization_s
        if timings.HasField("inference_s"):
            self.inference = timings.inference_s

    def timings_ms(self, total: float | None) -> list[tuple[str, float]]:
        """(name, milliseconds) of the stages measured so far, then `ttft` and `total` when known."""
        values = (self.hold, self.tokenization, self.queue, self.inference, self.ttft, total)
        return [(name, value * 1000) for name, value in zip(TIMINGS, values, strict=True) if value is not None]


def server_timing(timings: list[tuple[str, float]]) -> bytes:
    """The `Server-Timing` header's value: `hold;dur=0.05, tokenization;dur=0.20, ...` (milliseconds)."""
    return ", ".join(f"{name};dur={ms:.2f}" for name, ms in timings).encode()


EXCHANGE: ContextVar[Exchange | None] = ContextVar("exchange", default=None)


def current() -> Exchange:
    """The request being served (a detached one outside the middleware, e.g. in tests of a router)."""
    return EXCHANGE.get() or Exchange(REQUEST_ID.get(), time.perf_counter())


class TokenTimer:
    """Time to first delta (from the request's arrival; onto the Exchange too) and between deltas, of one
    generation."""

    __slots__ = ("exchange", "first", "inter_token", "last", "ttft")

    def __init__(self, model: str) -> None:
        self.ttft, self.inter_token = TTFT.labels(model), INTER_TOKEN.labels(model)  # looked up once, not per delta
        self.exchange = current()
        self.last = self.exchange.start
        self.first = True

    def tick(self) -> None:
        now = time.perf_counter()
        if self.first:
            self.exchange.ttft = now - self.last
            self.ttft.observe(self.exchange.ttft)
        else:
            self.inter_token.observe(now - self.last)
        self.first, self.last = False, now


def _request_id(scope: Scope) -> str:
    for key, value in scope["headers"]:
        if key == b"x-request-id":
            return sane_request_id(value.decode("latin-1")) or new_request_id()
    return new_request_id()


class HttpMetrics:
    """Outermost ASGI middleware, so that every answer counts, 401s, 413s and 404s included."""

    def __init__(self, app: ASGIApp, access_log_on: bool = True) -> None:
        self.app = app
        self.access_log_on = access_log_on

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        exchange = Exchange(_request_id(scope), time.perf_counter())
        # Each request runs in its own task: no reset, so the server's own error log carries the id too.
        bind_request_id(exchange.request_id)
        EXCHANGE.set(exchange)
        header = (REQUEST_ID_KEY.encode(), exchange.request_id.encode())
        status = 500  # what the server answers if the app fails before starting a response

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [*message.get("headers", ()), header]
                # A body whose length is known is complete: the time so far is the total. A stream's is not.
                complete = any(key == b"content-length" for key, _ in headers)
                timings = exchange.timings_ms(time.perf_counter() - exchange.start if complete else None)
                if timings:
                    headers.append((b"server-timing", server_timing(timings)))
                message = {**message, "headers": headers}
            await send(message)

        method = scope["method"]
        IN_PROGRESS.labels(method).inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            IN_PROGRESS.labels(method).dec()
            _finish(scope, exchange, status, self.access_log_on)


def _finish(scope: Scope, exchange: Exchange, status: int, access_log_on: bool) -> None:
    """Count the request and write its access-log line (when the log is on)."""
    method, model = scope["method"], exchange.model
    route = getattr(scope.get("route"), "path", UNMATCHED)  # the router sets the matched route
    seconds = time.perf_counter() - exchange.start
    REQUESTS.labels(method, route, model, str(status)).inc()
    LATENCY.labels(method, route, model).observe(seconds)
    if exchange.prompt_tokens:
        TOKENS.labels(model, "prompt").inc(exchange.prompt_tokens)
    if exchange.completion_tokens:
        TOKENS.labels(model, "completion").inc(exchange.completion_tokens)
    for stage, spent in zip(STAGES, (exchange.hold, exchange.tokenization, exchange.queue, exchange.inference),
                            strict=True):
        if spent is not None:
            _stage_series(model, stage).observe(spent)
    level = logging.DEBUG if route in QUIET_ROUTES else logging.INFO
    if not access_log_on or not access_log.isEnabledFor(level):
        return
    client = scope.get("client")
    timings = exchange.timings_ms(None)
    fields = {"method": method, "path": scope["path"], "route": route, "status": status, "model": model,
              "duration_ms": round(seconds * 1000, 1), "prompt_tokens": exchange.prompt_tokens,
              "completion_tokens": exchange.completion_tokens,
              "client": f"{client[0]}:{client[1]}" if client else None,
              **dict.fromkeys(_LOG_FIELDS), **{f"{name}_ms": round(ms, 2) for name, ms in timings}}
    # The path without its query string, and no headers: nothing secret reaches the log.
    access_log.log(level, "%s %s %d model=%s %.1fms prompt_tokens=%s completion_tokens=%s client=%s%s",
                   method, scope["path"], status, model or "-", fields["duration_ms"],
                   _or_dash(exchange.prompt_tokens), _or_dash(exchange.completion_tokens), fields["client"] or "-",
                   "".join(f" {name}={ms:.2f}ms" for name, ms in timings), extra=fields)



def record_key_usage(key: str, model: str, prompt: int, completion: int, cached: int) -> None:
    KEY_REQUESTS.labels(key, model).inc()
    for kind, tokens in (("prompt", prompt), ("completion", completion), ("cached", cached)):
        if tokens:
            KEY_TOKENS.labels(key, model, kind).inc(tokens)


def _or_dash(value: int | None) -> str:
    return "-" if value is None else str(value)


def _registry() -> CollectorRegistry | None:
    """With several edge workers (PROMETHEUS_MULTIPROC_DIR set, launcher/workers.py), every worker's
    metrics, summed; else this process's."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return None
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


async def metrics(request: Request) -> Response:
    registry = _registry()
    return Response(generate_latest() if registry is None else generate_latest(registry),
                    media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: FastAPI, access_log_on: bool = True) -> None:
    """Count and log every request (unless the access log is off) and serve GET /metrics; call after the
    app's other middleware."""
    # An API route (not a bare Starlette one), so that its requests are labelled and logged as /metrics.
    app.add_api_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    app.add_middleware(HttpMetrics, access_log_on=access_log_on)
