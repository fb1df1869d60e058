"""Interactive latency beside a bulk key: time to first token (TTFT) of interactive chat requests sent at a
fixed rate, alone, then beside a low-priority key that keeps the model saturated, once with both keys
in one priority class (fair between keys) and once with the bulk key's default priority lower; then
beside a Batch API job of the bulk key (`--batch-lines` chat lines, which the edge runs itself at the
lowest priority, `--batch-concurrency` lines at once).

    python bench/priority.py [--seconds 20] [--rate 4] [--slots 4] [--bulk-concurrency 32] [--delay-ms 20] \
        [--batch-lines 5000] [--batch-concurrency 8]

Starts its own Triton (the FasterTransformer echo model of the test repository, `--delay-ms` a token, so
that the model's time is known and nothing else limits it), llm service and edge, the edge's queue on
(`--slots` requests of the model at once, TRITONGATE_QUEUE_SLOTS) and a state store of its own with
three keys made by `tritongate keys create`: `interactive` (priority 0), `bulk-fair` (priority 0) and
`bulk-low` (priority 50). Interactive requests stream and are sent open loop at `--rate` a second (a
late answer does not slow the sender); the bulk key runs closed loop at `--bulk-concurrency`, more than
the slots, so that its requests always wait. Prints one JSON document: per phase, TTFT p50/p99 of the
interactive requests and how many bulk requests (or batch lines) were served, and p99 relative to the
alone phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_main, percentile_ms, private_stack
from tritongate.settings import default_models_dir

ROOT = Path(__file__).resolve().parent.parent
MODEL = "ft-echo"
KEYS = {"interactive": 0, "bulk-fair": 0, "bulk-low": 50}  # name → default priority
INTERACTIVE = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "stream": True}
BULK = {"messages": [{"role": "user", "content": "a long job"}], "max_tokens": 32}


@contextlib.contextmanager
def environment(**values: str) -> Iterator[None]:
    """The stack's processes inherit these settings (Settings reads the environment)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def create_keys() -> dict[str, str]:
    keys = {}
    for name, priority in KEYS.items():
        done = subprocess.run([sys.executable, "-m", "launcher.cli", "keys", "create", name, "--priority",
                               str(priority), "--json"], capture_output=True, text=True, check=True)
        keys[name] = json.loads(done.stdout)["key"]
    return keys


async def ttft(http: httpx.AsyncClient, url: str, key: str) -> float | None:
    """Seconds to the first generated text of one streamed request; None when it failed."""
    sent = time.perf_counter()
    async with http.stream("POST", url, json={"model": MODEL, **INTERACTIVE},
                           headers={"Authorization": f"Bearer {key}"}) as response:
        if response.status_code != 200:
            return None
        async for line in response.aiter_lines():
            if line.startswith("data:") and '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - sent
    return None


async def bulk_loop(http: httpx.AsyncClient, url: str, key: str, concurrency: int, stop: asyncio.Event) -> int:
    served = 0

    async def worker() -> None:
        nonlocal served
        while not stop.is_set():
            response = await http.post(url, json={"model": MODEL, **BULK}, headers={"Authorization": f"Bearer {key}"})
            served += response.status_code == 200

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return served


async def submit_batch(http: httpx.AsyncClient, base: str, key: str, lines: int) -> str:
    """A batch of `lines` chat lines made by `key`; its id."""
    auth = {"Authorization": f"Bearer {key}"}
    body = "".join(json.dumps({"custom_id": f"line-{i}", "method": "POST", "url": "/v1/chat/completions",
                               "body": {"model": MODEL, **BULK}}) + "\n" for i in range(lines))
    file = await http.post(f"{base}/v1/files", headers=auth, data={"purpose": "batch"},
                           files={"file": ("batch.jsonl", body.encode())})
    file.raise_for_status()
    batch = await http.post(f"{base}/v1/batches", headers=auth, json={
        "input_file_id": file.json()["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})
    batch.raise_for_status()
    return str(batch.json()["id"])


async def batch_lines_done(http: httpx.AsyncClient, base: str, key: str, batch_id: str) -> int:
    answer = await http.get(f"{base}/v1/batches/{batch_id}", headers={"Authorization": f"Bearer {key}"})
    answer.raise_for_status()
    counts = answer.json()["request_counts"]
    return int(counts["completed"]) + int(counts["failed"])


async def phase(http: httpx.AsyncClient, url: str, keys: dict[str, str], bulk: str | None, seconds: float,
                rate: float, concurrency: int, batch_lines: int = 0) -> dict[str, Any]:
    stop = asyncio.Event()
    base, owner = url.removesuffix("/v1/chat/completions"), keys[bulk] if bulk else ""
    batch_id, lines_before, loop = None, 0, None
    if bulk and batch_lines:
        batch_id = await submit_batch(http, base, owner, batch_lines)
    elif bulk:
        loop = asyncio.create_task(bulk_loop(http, url, owner, concurrency, stop))
    if bulk:
        await asyncio.sleep(2.0)  # the queue fills before measuring
    if batch_id is not None:
        lines_before = await batch_lines_done(http, base, owner, batch_id)
    tasks = []
    start = time.perf_counter()
    for i in range(int(seconds * rate)):  # open loop: each request at its time, whatever the others do
        await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(ttft(http, url, keys["interactive"])))
    results = await asyncio.gather(*tasks)
    stop.set()
    served = await loop if loop is not None else 0
    if batch_id is not None:
        served = await batch_lines_done(http, base, owner, batch_id) - lines_before
        cancel = await http.post(f"{base}/v1/batches/{batch_id}/cancel", headers={"Authorization": f"Bearer {owner}"})
        cancel.raise_for_status()
    times = sorted(t for t in results if t is not None)
    row = {"interactive_requests": len(results), "failed": len(results) - len(times),
           "ttft_p50_ms": percentile_ms(times, 0.5) if times else None,
           "ttft_p99_ms": percentile_ms(times, 0.99) if times else None, "bulk_served": served}
    print(json.dumps({"phase": f"{bulk} batch" if batch_id else bulk or "alone", **row}), file=sys.stderr, flush=True)
    return row


async def run(seconds: float, rate: float, slots: int, bulk_concurrency: int, delay_ms: float, batch_lines: int,
              batch_concurrency: int) -> dict[str, Any]:
    smollm2 = str(default_models_dir() / "smollm2-135m-instruct")
    entry = {"name": MODEL, "path": smollm2, "triton_inputs": {"delay_ms": delay_ms}}
    with tempfile.TemporaryDirectory(prefix="tritongate-bench-priority-") as tmp, environment(
            TRITONGATE_STATE_URL=f"sqlite://{Path(tmp) / 'state.sqlite3'}", TRITONGATE_QUEUE_SLOTS=str(slots),
            TRITONGATE_QUEUE_TIMEOUT_S="600", TRITONGATE_BATCH_CONCURRENCY=str(batch_concurrency),
            TRITONGATE_BATCH_FILES_DIR=str(Path(tmp) / "files")):
        keys = create_keys()
        with private_stack({"llm": [entry]}, [MODEL], (ROOT / "tests" / "triton_models",)) as stack:
            url = f"{stack.edge_url}/v1/chat/completions"
            limits = httpx.Limits(max_connections=bulk_concurrency + int(rate * seconds) + 8)
            async with httpx.AsyncClient(timeout=600, limits=limits) as http:
                for _ in range(10):  # warm-up: connections, the first generations
                    await ttft(http, url, keys["interactive"])
                phases = {name: await phase(http, url, keys, bulk, seconds, rate, bulk_concurrency)
                          for name, bulk in (("alone", None), ("beside_bulk_same_priority", "bulk-fair"),
                                             ("beside_bulk_lower_priority", "bulk-low"))}
                if batch_lines:  # the bulk key's batch job: the edge runs it at the lowest priority
                    phases["beside_batch"] = await phase(http, url, keys, "bulk-fair", seconds, rate,
                                                         bulk_concurrency, batch_lines)
    alone = phases["alone"]["ttft_p99_ms"]
    for row in phases.values():
        row["ttft_p99_vs_alone"] = round(row["ttft_p99_ms"] / alone, 2) if alone and row["ttft_p99_ms"] else None
    return {"benchmark": "priority", "model": MODEL, "delay_ms_per_token": delay_ms, "slots": slots,
            "rate_per_s": rate, "bulk_concurrency": bulk_concurrency, "seconds_per_phase": seconds,
            "batch_lines": batch_lines, "batch_concurrency": batch_concurrency,
            "phases": phases}


def arguments(parser: Any) -> None:
    parser.add_argument("--rate", type=float, default=4.0, help="interactive requests a second (default 4)")
    parser.add_argument("--slots", type=int, default=4, help="TRITONGATE_QUEUE_SLOTS of the edge (default 4)")
    parser.add_argument("--bulk-concurrency", type=int, default=32, help="the bulk key's requests in flight")
    parser.add_argument("--delay-ms", type=float, default=20.0, help="the echo model's time a token (default 20)")
    parser.add_argument("--batch-lines", type=int, default=5000,
                        help="lines of the bulk key's batch in the last phase (0: no batch phase; default 5000)")
    parser.add_argument("--batch-concurrency", type=int, default=8,
                        help="TRITONGATE_BATCH_CONCURRENCY: the lines the edge runs at once (default 8)")


if __name__ == "__main__":
    bench_main(__doc__, run, arguments)
