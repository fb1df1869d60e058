"""A batch's record as the state store keeps it: OpenAI's `Batch` object, plus its owner's key name and
which lines are answered (a bit per line), in one value that every change rewrites atomically (the store's
`update`). A line's bit is set once: a line answered twice (by an edge process that lost its lease) is
counted once."""

from __future__ import annotations

import re
import time
from typing import Any

RUNNING = ("validating", "in_progress", "finalizing", "cancelling")
WINDOW = re.compile(r"(\d+)([smh])")
MAX_WINDOW_S = 24 * 3600
_UNIT_S = {"s": 1, "m": 60, "h": 3600}


def window_s(completion_window: str) -> int | None:
    """The seconds of a completion window: OpenAI's "24h", or a shorter one in the same form ("30m", "90s");
    None when it is not one."""
    match = WINDOW.fullmatch(completion_window)
    if match is None:
        return None
    seconds = int(match[1]) * _UNIT_S[match[2]]
    return seconds if 0 < seconds <= MAX_WINDOW_S else None


def new(batch_id: str, owner: str | None, endpoint: str, input_file_id: str, completion_window: str,
        metadata: dict[str, str] | None, total: int, now: int) -> dict[str, Any]:
    window = window_s(completion_window)
    assert window is not None
    return {"id": batch_id, "object": "batch", "endpoint": endpoint, "errors": None,
            "input_file_id": input_file_id, "completion_window": completion_window, "status": "validating",
            "output_file_id": None, "error_file_id": None, "created_at": now, "in_progress_at": None,
            "expires_at": now + window, "finalizing_at": None, "completed_at": None, "failed_at": None,
            "expired_at": None, "cancelling_at": None, "cancelled_at": None,
            "request_counts": {"total": total, "completed": 0, "failed": 0}, "metadata": metadata,
            "_owner": owner, "_answered": "0" * ((total + 3) // 4), "_created_ns": time.time_ns()}


def newest_first(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Batches or files, the newest first (to the nanosecond: `created_at` is in seconds)."""
    return sorted(items, key=lambda item: item["_created_ns"], reverse=True)


def public(record: dict[str, Any]) -> dict[str, Any]:
    """The record as the API shows it (OpenAI's `Batch`)."""
    return {key: value for key, value in record.items() if not key.startswith("_")}


def answered(record: dict[str, Any], index: int) -> bool:
    return bool(int(record["_answered"][index // 4], 16) >> (index % 4) & 1)


def count_answer(record: dict[str, Any], index: int, ok: bool) -> dict[str, Any] | None:
    """The record with line `index` answered and counted (completed when `ok`, else failed); None when it was
    answered already."""
    if answered(record, index):
        return None
    bits = record["_answered"]
    digit = f"{int(bits[index // 4], 16) | 1 << (index % 4):x}"
    counts = dict(record["request_counts"])
    counts["completed" if ok else "failed"] += 1
    return {**record, "_answered": bits[:index // 4] + digit + bits[index // 4 + 1:], "request_counts": counts}


def unanswered(record: dict[str, Any]) -> list[int]:
    return [index for index in range(record["request_counts"]["total"]) if not answered(record, index)]
