"""A recording pass-through in front of the edge, for clients that are programs (the agent CLIs): every
request is forwarded to the edge as it came and its answer streamed back as it comes, and each request is
kept (`Recorded`: method, path with its query, headers, JSON body) so that a test can assert on what the
client sent. It changes nothing on the way: the edge answers the client."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import ClientSession, ClientTimeout, web

from tests.support.ports import free_port

HOP_BY_HOP = {"host", "content-length", "transfer-encoding", "connection"}


@dataclass
class Recorded:
    method: str
    path: str  # with its query
    headers: dict[str, str]
    body: Any  # the JSON body (None when there is none or it is not JSON)


@contextmanager
def recording(target: str) -> Iterator[tuple[str, list[Recorded]]]:
    """A pass-through to `target` (the edge's URL) on a free loopback port: its URL and what it records."""
    recorded: list[Recorded] = []
    port = free_port()
    loop = asyncio.new_event_loop()
    started = threading.Event()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        recorded.append(Recorded(request.method, request.path_qs, dict(request.headers), parsed))
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        async with session.request(request.method, target + request.path_qs, data=body, headers=headers) as answer:
            response = web.StreamResponse(status=answer.status, headers={
                k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP})
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def serve() -> web.AppRunner:
        nonlocal session
        session = ClientSession(timeout=ClientTimeout(total=None), auto_decompress=False)
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        return runner

    session: ClientSession

    def run() -> None:
        asyncio.set_event_loop(loop)
        runner = loop.run_until_complete(serve())
        started.set()
        loop.run_forever()
        loop.run_until_complete(runner.cleanup())
        loop.run_until_complete(session.close())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started.wait(30)
    try:
        yield f"http://127.0.0.1:{port}", recorded
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
