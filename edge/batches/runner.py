"""Runs the batches: every edge process has a runner, which takes the batches whose lease is free or has
run out (`batches-active`, batches.py), one process per batch, and renews the lease while it works. A batch
runs at most `batch_concurrency` lines at once per process, each through the edge's own routes at the
lowest priority (inprocess.py); a line refused for overload (429, 503) waits as told and is sent again.

A line's answer is kept before it is counted, and a resumed batch skips the lines already answered, so a
batch that an edge process left (killed, restarted, its lease lost) goes on elsewhere with no line lost or
answered twice. It ends `completed` when every line is answered, `cancelled` once cancelled, `expired` past
its completion window; the lines it did not answer then get an error line each (`batch_cancelled`,
`batch_expired`), so that the output and error files answer every custom_id once."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
import uuid
from typing import Any

import orjson
from starlette.types import ASGIApp

from edge.batches import inprocess, records
from edge.batches import lines as lines_
from edge.batches.batches import OUTPUT, Batches
from edge.state import StoreUnavailable
from tritongate.settings import Settings

log = logging.getLogger(__name__)

RETRIED = (429, 503)  # overload: the line waits and goes again
MAX_RETRY_WAIT_S = 30.0
POLL_S = 2.0  # how often a runner looks for batches to take, when nothing wakes it
WATCH_S = 1.0  # how often it looks whether a batch it runs is being cancelled (and renews its lease)


class Stop(Exception):
    """Why a batch stops before every line is answered (its status to end with, or None: lease lost)."""

    def __init__(self, status: str | None) -> None:
        super().__init__(status)
        self.status = status


class Runner:
    def __init__(self, app: ASGIApp, batches: Batches, settings: Settings) -> None:
        self.app = app
        self.batches = batches
        self.me = uuid.uuid4().hex
        self.lease_s = settings.batch_lease_s
        self.concurrency = settings.batch_concurrency
        self.slots = asyncio.Semaphore(settings.batch_concurrency)  # lines at once in this process
        self.running: dict[str, asyncio.Task[None]] = {}

    async def serve(self) -> None:
        """Take and run batches until cancelled."""
        while True:
            self.batches.wake.clear()
            try:
                await self._take_free()
            except StoreUnavailable as exc:
                log.warning("batches: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.batches.wake.wait(), min(POLL_S, self.lease_s / 3))

    async def close(self) -> None:
        tasks = list(self.running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _take_free(self) -> None:
        for batch_id, value in await self.batches.active.items():
            lease = orjson.loads(value)
            if batch_id in self.running or (lease["owner"] is not None and lease["until"] > time.time()):
                continue
            if await self._lease(batch_id, take=True):
                task = asyncio.create_task(self._run(batch_id), name=f"batch {batch_id}")
                self.running[batch_id] = task
                task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.running = {batch_id: running for batch_id, running in self.running.items() if running is not task}

    async def _lease(self, batch_id: str, take: bool = False, release: bool = False) -> bool:
        """Renew this process's lease on the batch (or `take` a free or lapsed one); whether it holds it."""
        def renew(value: bytes | None) -> bytes | None:
            lease = None if value is None else orjson.loads(value)
            if lease is None:
                return None
            now = time.time()
            mine = lease["owner"] == self.me
            if not mine and not (take and (lease["owner"] is None or lease["until"] <= now)):
                return None
            return orjson.dumps({"owner": None, "until": 0} if release else
                                {"owner": self.me, "until": now + self.lease_s})

        return await self.batches.active.update(batch_id, renew) is not None

    async def _run(self, batch_id: str) -> None:
        stop = asyncio.Event()
        keeper = asyncio.create_task(self._keep(batch_id, stop))
        try:
            await self._work(batch_id, stop)
        except Stop:
            log.info("batch %s: its lease went to another edge process", batch_id)
        except asyncio.CancelledError:  # the edge stops: another process may take it at once
            with contextlib.suppress(Exception):
                await asyncio.shield(self._lease(batch_id, release=True))
            raise
        except Exception:
            log.exception("batch %s stopped; it resumes when its lease runs out", batch_id)
        finally:
            keeper.cancel()

    async def _keep(self, batch_id: str, stop: asyncio.Event) -> None:
        """Renew the lease (at least every third of it); set `stop` when it is lost or the batch is being
        cancelled."""
        while not stop.is_set():
            await asyncio.sleep(min(WATCH_S, self.lease_s / 3))
            try:
                if not await self._lease(batch_id):
                    stop.set()
                record = await self.batches.record(batch_id)
                if record is None or record["status"] == "cancelling":
                    stop.set()
            except StoreUnavailable as exc:
                log.warning("batch %s: %s", batch_id, exc)

    async def _work(self, batch_id: str, stop: asyncio.Event) -> None:
        record = await self.batches.record(batch_id)
        if record is None:
            await self.batches.active.delete(batch_id)
            return
        if record["status"] not in records.RUNNING:  # finished, but not cleaned up
            await self._clean_up(record)
            return
        owner = record["_owner"]
        try:
            content = await self.batches.files.content(owner, record["input_file_id"])
        except Exception as exc:  # deleted, or the file store failed: the batch fails, saying why
            await self._fail(record, f"The input file {record['input_file_id']} could not be read: {exc}")
            return
        parsed = lines_.parse(content, record["endpoint"])
        if record["status"] == "validating":
            record = await self.batches.change(batch_id, _started) or record
        status = _outcome(record)
        if record["status"] == "in_progress":
            try:
                await self._answer_all(record, parsed, stop)
            except Stop as stopped:
                if stopped.status is None:
                    raise
                status = stopped.status
        await self._finish(batch_id, parsed, status)

    async def _answer_all(self, record: dict[str, Any], parsed: list[lines_.Line], stop: asyncio.Event) -> None:
        batch_id = record["id"]
        todo = iter([parsed[index] for index in records.unanswered(record)])

        async def worker() -> None:
            for line in todo:
                await self._check(batch_id, record["expires_at"], stop)
                async with self.slots:
                    await self._check(batch_id, record["expires_at"], stop)
                    ok, answer = await self._answer(record, line, stop)
                await self.batches.answer(batch_id, line.index, ok, answer)

        workers = [asyncio.create_task(worker()) for _ in range(self.concurrency)]
        try:
            await asyncio.gather(*workers)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)

    async def _check(self, batch_id: str, expires_at: int, stop: asyncio.Event) -> None:
        if time.time() >= expires_at:
            raise Stop("expired")
        if stop.is_set():
            record = await self.batches.record(batch_id)
            raise Stop("cancelled" if record is not None and record["status"] == "cancelling" else None)

    async def _answer(self, record: dict[str, Any], line: lines_.Line, stop: asyncio.Event) -> tuple[bool, bytes]:
        if line.error is not None or line.body is None:
            assert line.error is not None
            return False, lines_.error_line(record["id"], line, line.error)
        while True:
            answer = await inprocess.post(self.app, record["endpoint"], line.body, record["_owner"])
            if answer.status not in RETRIED:
                break
            await asyncio.sleep(min(MAX_RETRY_WAIT_S, answer.retry_after_s or 1.0))
            await self._check(record["id"], record["expires_at"], stop)
        ok = 200 <= answer.status < 300
        return ok, lines_.response_line(record["id"], line, answer.status, answer.request_id, answer.body)

    async def _finish(self, batch_id: str, parsed: list[lines_.Line], status: str) -> None:
        """Write the output and error files (every line once: its answer, or an error saying why none) and
        end the batch with `status`."""
        record = await self.batches.change(batch_id, _finalizing) or await self.batches.record(batch_id)
        if record is None:
            return
        if record["status"] == "cancelling":  # cancelled while its last lines ran
            status = "cancelled"
        answers = await self.batches.answered(batch_id)
        unanswered = lines_.LineError(f"batch_{status}", f"The batch was {status} before this line ran.")
        output, errors = io.BytesIO(), io.BytesIO()
        for line in parsed:
            answer = answers.get(line.index)
            if answer is None:
                errors.write(lines_.error_line(batch_id, line, unanswered) + b"\n")
            else:
                (output if answer[:1] == OUTPUT else errors).write(answer[1:] + b"\n")
        suffix = batch_id.removeprefix("batch_")
        made = {}
        for kind, data in (("output", output), ("error", errors)):
            if data.tell():
                data.seek(0)
                file = await self.batches.files.create(record["_owner"], f"batch_{suffix}_{kind}.jsonl",
                                                       "batch_output", data, file_id=f"file-{suffix}-{kind}")
                made[f"{kind}_file_id"] = file["id"]
        completed = sum(1 for answer in answers.values() if answer[:1] == OUTPUT)
        now = int(time.time())

        def finished(record: dict[str, Any]) -> dict[str, Any]:
            counts = {**record["request_counts"], "completed": completed,
                      "failed": record["request_counts"]["total"] - completed}
            return {**record, **made, "status": status, f"{status}_at": now, "request_counts": counts}

        await self.batches.change(batch_id, finished)
        await self._clean_up(record)

    async def _fail(self, record: dict[str, Any], message: str) -> None:
        now = int(time.time())
        errors = {"object": "list", "data": [{"code": "invalid_file", "message": message, "param": "input_file_id",
                                              "line": None}]}
        await self.batches.change(record["id"], lambda r: {**r, "status": "failed", "failed_at": now,
                                                           "errors": errors})
        await self._clean_up(record)

    async def _clean_up(self, record: dict[str, Any]) -> None:
        await self.batches.forget_answers(record["id"], list(range(record["request_counts"]["total"])))
        await self.batches.active.delete(record["id"])


def _outcome(record: dict[str, Any]) -> str:
    """How a batch ends that is taken up as it is: every line answered (or answering them); cancelled; or,
    finalizing with lines unanswered, expired."""
    if record["status"] == "cancelling":
        return "cancelled"
    if record["status"] == "finalizing" and records.unanswered(record):
        return "expired"
    return "completed"


def _started(record: dict[str, Any]) -> dict[str, Any] | None:
    if record["status"] != "validating":
        return None
    return {**record, "status": "in_progress", "in_progress_at": int(time.time())}


def _finalizing(record: dict[str, Any]) -> dict[str, Any] | None:
    if record["status"] != "in_progress":
        return None
    return {**record, "status": "finalizing", "finalizing_at": int(time.time())}
