"""Request ids on log records, plain and JSON log lines, and the ids a merged encoder batch carries."""

from __future__ import annotations

import asyncio
import contextvars
import io
import json
import logging
from collections.abc import Iterator

import numpy as np
import pytest

from services.common.encoder import Batcher, Row
from tritongate.batching import MAX_BATCH_IDS
from tritongate.logs import REQUEST_ID, RequestIdFilter, configure_logging, formatter, sane_request_id


@pytest.fixture
def root() -> Iterator[logging.Logger]:
    """The root logger, restored afterwards (configure_logging replaces its handlers)."""
    logger = logging.getLogger()
    handlers, level = logger.handlers[:], logger.level
    yield logger
    logger.handlers[:] = handlers
    logger.setLevel(level)


def capture(json_lines: bool) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(formatter(json_lines))
    logger = logging.getLogger(f"test.logs.{json_lines}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, out


def test_plain_lines_carry_the_request_id_or_a_dash() -> None:
    logger, out = capture(json_lines=False)
    logger.info("outside")
    contextvars.copy_context().run(lambda: (REQUEST_ID.set("abc-123"), logger.info("inside")))
    first, second = out.getvalue().splitlines()
    assert first.endswith("INFO test.logs.False [-]: outside")
    assert second.endswith("INFO test.logs.False [abc-123]: inside")


def test_json_lines_are_objects_with_the_request_id_and_extra_fields() -> None:
    logger, out = capture(json_lines=True)
    token = REQUEST_ID.set("rid-7")
    try:
        logger.info("%s done", "GET /x", extra={"status": 200, "model": "m"})
    finally:
        REQUEST_ID.reset(token)
    line = json.loads(out.getvalue())
    assert {k: line[k] for k in ("level", "logger", "request_id", "message", "status", "model")} == {
        "level": "INFO", "logger": "test.logs.True", "request_id": "rid-7", "message": "GET /x done",
        "status": 200, "model": "m"}
    assert line["time"]


@pytest.mark.parametrize(("env", "verbose", "level"), [
    (None, False, logging.INFO), ("warning", False, logging.WARNING), ("warning", True, logging.DEBUG),
    ("nonsense", False, logging.INFO)])
def test_log_level_from_the_environment_and_verbose(root: logging.Logger, monkeypatch: pytest.MonkeyPatch,
                                                    env: str | None, verbose: bool, level: int) -> None:
    if env is None:
        monkeypatch.delenv("LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("LOG_LEVEL", env)
    configure_logging(verbose, json_lines=True)
    assert root.level == level
    (handler,) = root.handlers
    assert any(isinstance(f, RequestIdFilter) for f in handler.filters)
    assert type(handler.formatter).__name__ == "JsonFormatter"


@pytest.mark.parametrize(("given", "kept"), [
    ("req-1", True), ("a" * 128, True), ("a" * 129, False), ("", False), (None, False), ("tab\there", False),
    ("café", False), ("with space", True)])
def test_sane_request_ids(given: str | None, kept: bool) -> None:
    assert sane_request_id(given) == (given if kept else None)


async def test_a_merged_batch_carries_the_distinct_ids_of_its_requests() -> None:
    seen: list[str] = []
    release = asyncio.Event()

    async def call(rows: list[Row]) -> np.ndarray:
        seen.append(REQUEST_ID.get())
        await release.wait()
        return np.zeros((len(rows), 1))

    batcher = Batcher(call, batch_size=8, slots=1, model="m", busy=lambda: True)

    async def submit(request_id: str, n: int) -> np.ndarray:
        REQUEST_ID.set(request_id)  # this task's own context, as in a service's RPC task
        return await batcher.submit([Row([1])] * n)

    first = asyncio.create_task(submit("a", 1))
    await asyncio.sleep(0)
    waiting = [asyncio.create_task(submit(rid, 1)) for rid in ("b", "c", "b")]
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(first, *waiting)
    assert seen == ["a", "b,c"]
    assert REQUEST_ID.get() == "-"  # the caller's context is untouched


async def test_batch_ids_are_capped() -> None:
    seen: list[str] = []

    async def call(rows: list[Row]) -> np.ndarray:
        seen.append(REQUEST_ID.get())
        return np.zeros((len(rows), 1))

    batcher = Batcher(call, batch_size=64, slots=1, busy=lambda: True)
    blocker = asyncio.Event()

    async def submit(request_id: str) -> None:
        REQUEST_ID.set(request_id)
        await blocker.wait()
        await batcher.submit([Row([1])])

    tasks = [asyncio.create_task(submit(f"{i:0>40}")) for i in range(20)]
    await asyncio.sleep(0)
    blocker.set()
    await asyncio.gather(*tasks)
    assert max(len(ids) for ids in seen) == MAX_BATCH_IDS


@pytest.mark.parametrize("on", [True, False])
def test_the_access_log_can_be_turned_off(on: bool, caplog: pytest.LogCaptureFixture) -> None:
    from fastapi.testclient import TestClient

    from edge.app import create_app
    from tritongate.settings import Settings

    caplog.set_level(logging.INFO, logger="tritongate.access")
    with TestClient(create_app(Settings(access_log=on))) as client:
        assert client.get("/v1/no-such-route").status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "tritongate.access"]
    assert len(lines) == (1 if on else 0)
    assert all(line.startswith("GET /v1/no-such-route 404 model=-") for line in lines)
