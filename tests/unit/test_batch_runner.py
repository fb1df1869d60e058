"""The batch runner against a scripted app standing in for the edge's routes, its state in a real SQLite
file or Redis server that two edge processes (two stores on one state) share: each line goes through the app once,
carrying whose it is and its priority; one runner runs a batch while another waits; a runner that stops
mid-batch hands it over and the other finishes it without asking again for the lines already answered."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Receive, Scope, Send

from edge.batches.batches import Batches
from edge.batches.runner import Runner
from edge.state import StateStore, open_store
from tritongate.settings import Settings

LINES = 40
SETTINGS = Settings(batch_lease_s=0.5, batch_concurrency=3)


class ScriptedApp:
    """Answers each request with its input after `delay_s`, and remembers what it was asked."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s
        self.inputs: Counter[str] = Counter()
        self.scopes: list[Scope] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = orjson.loads((await receive())["body"])
        self.scopes.append(scope)
        await asyncio.sleep(self.delay_s)
        self.inputs[body["input"]] += 1
        await send({"type": "http.response.start", "status": 200, "headers": [(b"x-request-id", b"req-1")]})
        await send({"type": "http.response.body", "body": orjson.dumps({"echo": body["input"]})})


@pytest.fixture(params=["sqlite", "redis"])
async def stores(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[list[StateStore]]:
    """Two stores on one state, as two edge processes have (each test's batch ids are its own)."""
    url = f"sqlite://{tmp_path / 'state.sqlite3'}" if request.param == "sqlite" else \
        request.getfixturevalue("redis_server").url
    opened = [open_store(url) for _ in range(2)]
    yield opened
    for store in opened:
        await store.close()


def batches_on(store: StateStore, tmp_path: Path) -> Batches:
    return Batches.open(Settings(batch_files_dir=tmp_path / "files"), store)


async def submit(batches: Batches) -> str:
    lines = [{"custom_id": f"id-{i}", "method": "POST", "url": "/v1/embeddings", "body": {"input": f"text {i}"}}
             for i in range(LINES)]
    file = await batches.files.create("team-a", "in.jsonl", "batch", io.BytesIO(b"\n".join(map(orjson.dumps, lines))))
    return str((await batches.create("team-a", file["id"], "/v1/embeddings", "24h", None))["id"])


async def until(batches: Batches, batch_id: str, check: Any) -> dict[str, Any]:
    for _ in range(400):
        record = await batches.record(batch_id)
        if record is not None and check(record):
            return record
        await asyncio.sleep(0.05)
    raise TimeoutError(record)


async def output_ids(batches: Batches, record: dict[str, Any]) -> list[str]:
    content = await batches.files.content("team-a", record["output_file_id"])
    return [orjson.loads(line)["custom_id"] for line in content.splitlines()]


async def answered_lines(batches: Batches, batch_id: str) -> list[bool]:
    answers = await batches.answered(batch_id)
    return [index in answers for index in range(LINES)]


async def test_one_of_two_runners_runs_a_batch_and_each_line_goes_through_once(stores: list[StateStore],
                                                                               tmp_path: Path) -> None:
    apps = [ScriptedApp(0.01), ScriptedApp(0.01)]
    sides = [batches_on(store, tmp_path) for store in stores]
    runners = [Runner(app, side, SETTINGS) for app, side in zip(apps, sides, strict=True)]
    serving = [asyncio.create_task(runner.serve()) for runner in runners]
    try:
        batch_id = await submit(sides[0])
        record = await until(sides[1], batch_id, lambda r: r["status"] == "completed")
    finally:
        for task in serving:
            task.cancel()
        for runner in runners:
            await runner.close()
    assert record["request_counts"] == {"total": LINES, "completed": LINES, "failed": 0}
    assert sorted(await output_ids(sides[0], record)) == sorted(f"id-{i}" for i in range(LINES))
    ran = [app for app in apps if app.inputs]
    assert len(ran) == 1 and set(ran[0].inputs.values()) == {1} and len(ran[0].inputs) == LINES
    scope = ran[0].scopes[0]
    assert scope["extensions"]["tritongate"] == {"key_name": "team-a", "priority": "batch"}
    assert scope["path"] == "/v1/embeddings" and b"authorization" not in dict(scope["headers"])


async def test_a_runner_that_stops_mid_batch_hands_it_over(stores: list[StateStore], tmp_path: Path) -> None:
    first_app, second_app = ScriptedApp(0.05), ScriptedApp(0.0)
    first_side, second_side = (batches_on(store, tmp_path) for store in stores)
    first = Runner(first_app, first_side, SETTINGS)
    serving = asyncio.create_task(first.serve())
    batch_id = await submit(first_side)
    await until(first_side, batch_id, lambda r: r["request_counts"]["completed"] >= 10)
    serving.cancel()
    await first.close()  # the edge stops: its lease is given up
    kept = {f"text {i}" for i, bit in enumerate(await answered_lines(second_side, batch_id)) if bit}
    second = Runner(second_app, second_side, SETTINGS)
    serving = asyncio.create_task(second.serve())
    try:
        record = await until(second_side, batch_id, lambda r: r["status"] == "completed")
    finally:
        serving.cancel()
        await second.close()
    assert 10 <= len(kept) < LINES
    assert not kept & set(second_app.inputs) and set(first_app.inputs) | set(second_app.inputs) == {
        f"text {i}" for i in range(LINES)}
    assert sorted(await output_ids(second_side, record)) == sorted(f"id-{i}" for i in range(LINES))
    assert record["request_counts"]["completed"] == LINES

