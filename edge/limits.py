"""Request body size limit, enforced before the body is parsed (413, in the error shape of the route); a
path may have a limit of its own (file uploads)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from edge.errors import OpenAIError


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    """Rejects bodies over `max_bytes`, by Content-Length or while streaming a chunked body."""

    def __init__(self, app: ASGIApp, max_bytes: int, paths: Mapping[str, int] | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.paths = paths or {}

    def _error(self, max_bytes: int) -> OpenAIError:
        return OpenAIError(413, f"The request body is larger than the limit of {max_bytes} bytes.",
                           code="request_too_large")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        max_bytes = self.paths.get(scope["path"], self.max_bytes)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > max_bytes:
            await self._error(max_bytes).response(scope["path"])(scope, receive, send)
            return
        received = 0
        exceeded = False

        async def limited_receive() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def guarded_send(message: Message) -> None:
            if not exceeded:  # the framework answers a failed body read with its own error: replace it
                await send(message)

        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, limited_receive, guarded_send)
        if exceeded:
            await self._error(max_bytes).response(scope["path"])(scope, receive, send)
