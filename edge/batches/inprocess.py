"""A request sent through the edge's own ASGI app, in this process: the real routes and every middleware
(keys, limits, queueing, metrics), as a client's request would go, without a socket. It carries no
Authorization header: `scope["extensions"]["tritongate"]` says whose it is and at what priority, which
only an in-process caller can set (a server builds the scope of every request from the network)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message

from tritongate.wire import REQUEST_ID_KEY

BATCH_PRIORITY = "batch"  # the lowest


@dataclass(frozen=True)
class Answer:
    status: int
    request_id: str
    body: bytes
    retry_after_s: float | None


def _retry_after(value: str | None) -> float | None:
    try:
        return None if value is None else max(0.0, float(value))
    except ValueError:
        return None


async def post(app: ASGIApp, path: str, body: bytes, key_name: str | None) -> Answer:
    scope: dict[str, Any] = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "root_path": "",
        "query_string": b"", "client": None, "server": None, "state": {},
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "extensions": {"tritongate": {"key_name": key_name, "priority": BATCH_PRIORITY}},
    }
    delivered = False
    status, headers, chunks = 500, {}, []

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the caller never goes away: the request runs to its end
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        nonlocal status, headers
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = {name.decode().lower(): value.decode() for name, value in message.get("headers", [])}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope, receive, send)
    return Answer(status, headers.get(REQUEST_ID_KEY, ""), b"".join(chunks), _retry_after(headers.get("retry-after")))
