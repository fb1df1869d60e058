"""The events file: the test models (tests/triton_models) append what they observe there, one JSON object
a line, when $TRITONGATE_TEST_EVENTS names it (e.g. `{"event": "cancelled", "request_id": ...}`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EVENTS_ENV = "TRITONGATE_TEST_EVENTS"


def new_events_file(directory: Path) -> Path:
    """An empty events file in `directory`."""
    path = directory / "events.jsonl"
    path.touch()
    return path


def events_offset(path: Path) -> int:
    """Where the next event will start: pass it to `read_events` to see only what comes after now."""
    return len(path.read_text())


def read_events(path: Path, offset: int = 0) -> list[dict[str, Any]]:
    """The events written from `offset` on."""
    return [json.loads(line) for line in path.read_text()[offset:].splitlines() if line]
