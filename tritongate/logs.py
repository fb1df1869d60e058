"""Logging for every process: the level (LOG_LEVEL, as in Denglin's openai_api; --verbose), plain or JSON
lines, and the id of the request being served on every line.

The edge takes the id from `X-Request-ID` (or makes one), passes it to the services in gRPC metadata
(`x-request-id`), and they pass it on to Triton as the request id. `REQUEST_ID` holds it for the code
serving that request: asyncio tasks inherit it, so every log line about the request carries it.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from contextvars import ContextVar

from tritongate.wire import REQUEST_ID_KEY

MAX_REQUEST_ID = 128
NO_REQUEST = "-"

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default=NO_REQUEST)
_on_bind: list[Callable[[str], None]] = []  # e.g. tracing: put the id on the span being served

FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def sane_request_id(value: str | None) -> str | None:
    """A caller's id if it is safe to echo, log and send on (printable ASCII, at most 128 characters)."""
    if value and len(value) <= MAX_REQUEST_ID and value.isascii() and value.isprintable():
        return value
    return None


def new_request_id() -> str:
    return uuid.uuid4().hex


def bind_request_id(request_id: str) -> None:
    """The id of the request the current task serves (its child tasks inherit it)."""
    REQUEST_ID.set(request_id)
    for callback in _on_bind:
        callback(request_id)


def on_bind(callback: Callable[[str], None]) -> None:
    _on_bind.append(callback)


def request_metadata() -> tuple[tuple[str, str], ...]:
    """gRPC metadata that carries the current request id to a service."""
    return ((REQUEST_ID_KEY, REQUEST_ID.get()),)


class RequestIdFilter(logging.Filter):
    """Puts `request_id` on every record ("-" outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def formatter(json_lines: bool) -> logging.Formatter:
    if not json_lines:
        return logging.Formatter(FORMAT)
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    # Fields named in the format come first; a record's `extra` fields are added after them, except
    # uvicorn's coloured copy of its message.
    return JsonFormatter("%(asctime)s %(levelname)s %(name)s %(request_id)s %(message)s",
                         rename_fields={"levelname": "level", "name": "logger", "asctime": "time"},
                         reserved_attrs=[*RESERVED_ATTRS, "color_message"])


def configure_logging(verbose: bool = False, json_lines: bool = False) -> None:
    """Log level from the LOG_LEVEL variable of Denglin's openai_api (default INFO); --verbose means DEBUG."""
    level = "DEBUG" if verbose else os.environ.get("LOG_LEVEL", "INFO").upper()
    # Our lines show no process or thread: skip collecting them (a third of a record's cost).
    logging.logProcesses = logging.logThreads = logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())  # on the handler: records of every logger pass through it
    handler.setFormatter(formatter(json_lines))
    logging.basicConfig(level=level if level in logging.getLevelNamesMapping() else "INFO", handlers=[handler],
                        force=True)
