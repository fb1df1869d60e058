"""The batches in the shared state store, for the routes and the runner alike:

- `batches`: each batch's record (records.py), by id;
- `batches-active`: the batches not yet finished, each with its lease (`{"owner", "until"}`): the edge
  process that runs it and until when; a lease not renewed in time (its process died) is taken over;
- `batch-answers`: each answered line, by `<batch id>:<index>`, written before the line is counted, so that
  a batch resumed elsewhere skips it and its output holds it once.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.requests import HTTPConnection

from edge.batches import files as files_
from edge.batches import lines as lines_
from edge.batches import records
from edge.errors import OpenAIError, bad_request
from edge.state import Limits, Space, StateStore
from tritongate.settings import Settings

MAX_RECORDS = 1_000_000  # far more than anyone keeps: the retention is what forgets them
MAX_ANSWERS = 100_000_000
OUTPUT, ERROR = b"o", b"e"  # an answer's first byte: which file it goes to


def key_name(connection: HTTPConnection) -> str | None:
    """The name of the caller's key, as authentication left it (None when keys are off)."""
    api_key = connection.scope.get("state", {}).get("api_key")
    return getattr(api_key, "name", None)


def not_found(batch_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such Batch object: {batch_id}", "batch_id", "batch_not_found")


def _loads(value: bytes | None) -> dict[str, Any] | None:
    return None if value is None else orjson.loads(value)


@dataclass
class Batches:
    files: files_.Files
    records: Space
    active: Space
    answers: Space
    wake: asyncio.Event = field(default_factory=asyncio.Event)  # a batch to run here, or to cancel

    @classmethod
    def open(cls, settings: Settings, store: StateStore) -> Batches:
        kept = Limits(MAX_RECORDS, settings.batch_retention_s)
        return cls(files=files_.Files(files_.open_file_bytes(settings), store.space("files", kept)),
                   records=store.space("batches", kept), active=store.space("batches-active", kept),
                   answers=store.space("batch-answers", Limits(MAX_ANSWERS, settings.batch_retention_s)))

    # The API's side.

    async def create(self, owner: str | None, input_file_id: str, endpoint: str, completion_window: str,
                     metadata: dict[str, str] | None) -> dict[str, Any]:
        if endpoint not in lines_.ENDPOINTS:
            raise bad_request(f"`endpoint` must be one of {', '.join(lines_.ENDPOINTS)}.", "endpoint")
        if records.window_s(completion_window) is None:
            raise bad_request("`completion_window` must be '24h' (or a shorter one: '30m', '90s').",
                              "completion_window")
        file = await self.files.get(owner, input_file_id, "input_file_id")
        if file["purpose"] != "batch":
            raise bad_request(f"File {input_file_id} has purpose {file['purpose']!r}, not 'batch'.", "input_file_id")
        parsed = lines_.parse(await self.files.content(owner, input_file_id), endpoint)
        if not parsed:
            raise bad_request(f"File {input_file_id} holds no requests.", "input_file_id", "empty_file")
        if twice := lines_.duplicate_ids(parsed):
            raise bad_request(f"The custom_id {twice[0]!r} appears more than once in file {input_file_id}; each "
                              "line needs its own.", "input_file_id", "duplicate_custom_id")
        record = records.new(f"batch_{uuid.uuid4().hex}", owner, endpoint, input_file_id, completion_window,
                             metadata, len(parsed), int(time.time()))
        await self.records.put(record["id"], orjson.dumps(record))
        await self.active.put(record["id"], orjson.dumps({"owner": None, "until": 0}))
        self.wake.set()
        return record

    async def get(self, owner: str | None, batch_id: str) -> dict[str, Any]:
        record = await self.record(batch_id)
        if record is None or record["_owner"] != owner:
            raise not_found(batch_id)
        return record

    async def listed(self, owner: str | None) -> list[dict[str, Any]]:
        """The owner's batches, newest first."""
        mine = [r for _, value in await self.records.items() if (r := orjson.loads(value))["_owner"] == owner]
        return records.newest_first(mine)

    async def cancel(self, owner: str | None, batch_id: str) -> dict[str, Any]:
        found = await self.get(owner, batch_id)
        if found["status"] not in ("validating", "in_progress", "cancelling", "cancelled"):
            raise OpenAIError(409, f"Batch {batch_id} is {found['status']}: it cannot be cancelled.", "batch_id",
                              "batch_not_cancellable")

        def cancelling(record: dict[str, Any]) -> dict[str, Any] | None:
            if record["status"] not in ("validating", "in_progress"):
                return None
            return {**record, "status": "cancelling", "cancelling_at": int(time.time())}

        changed = await self.change(batch_id, cancelling)
        self.wake.set()
        return changed or await self.get(owner, batch_id)

    # The runner's side.

    async def record(self, batch_id: str) -> dict[str, Any] | None:
        return _loads(await self.records.get(batch_id))

    async def change(self, batch_id: str, change: Callable[[dict[str, Any]], dict[str, Any] | None]
                     ) -> dict[str, Any] | None:
        """Apply `change` to the record atomically; the new record, or None when it changed nothing."""
        def apply(value: bytes | None) -> bytes | None:
            record = _loads(value)
            new = None if record is None else change(record)
            return None if new is None else orjson.dumps(new)

        return _loads(await self.records.update(batch_id, apply))

    async def answer(self, batch_id: str, index: int, ok: bool, line: bytes) -> None:
        """Keep a line's answer, then count it (once, whoever answered it first)."""
        await self.answers.put(f"{batch_id}:{index:08d}", (OUTPUT if ok else ERROR) + line)
        await self.change(batch_id, lambda record: records.count_answer(record, index, ok))

    async def answered(self, batch_id: str) -> dict[int, bytes]:
        """The answers kept for a batch, by line index (each with its first byte: OUTPUT or ERROR)."""
        return {int(key.rpartition(":")[2]): value for key, value in await self.answers.items(f"{batch_id}:")}

    async def forget_answers(self, batch_id: str, indexes: list[int]) -> None:
        for index in indexes:
            await self.answers.delete(f"{batch_id}:{index:08d}")


def batches_of(connection: HTTPConnection) -> Batches:
    batches: Batches = connection.app.state.batches
    return batches
