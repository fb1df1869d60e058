"""Prometheus metrics of the edge at GET /metrics: HTTP requests by route and status, their latency
(to the last byte, so a stream counts whole) and the requests in progress."""

from __future__ import annotations

import time

from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUESTS = Counter("http_requests_total", "HTTP requests answered, by route template and status.",
                   ("method", "route", "status"))
LATENCY = Histogram("http_request_duration_seconds", "Time from a request to the last byte of its response.",
                    ("method", "route"),
                    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600))
IN_PROGRESS = Gauge("http_requests_in_progress", "HTTP requests being answered now.", ("method",))

UNMATCHED = "unmatched"  # any path no route serves: one label value, however many paths clients try


class HttpMetrics:
    """Outermost ASGI middleware, so that every answer counts, 413s and 404s included."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the server answers if the app fails before starting a response

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        method = scope["method"]
        start = time.perf_counter()
        IN_PROGRESS.labels(method).inc()
        try:
            await self.app(scope, receive, send_and_record)
        finally:
            IN_PROGRESS.labels(method).dec()
            route = getattr(scope.get("route"), "path", UNMATCHED)  # the router sets the matched route
            REQUESTS.labels(method, route, str(status)).inc()
            LATENCY.labels(method, route).observe(time.perf_counter() - start)


async def metrics(request: Request) -> Response:
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)


def install_metrics(app: FastAPI) -> None:
    """Count every request and serve GET /metrics; call after the app's other middleware."""
    app.add_route("/metrics", metrics, methods=["GET"], include_in_schema=False)
    app.add_middleware(HttpMetrics)
