"""How one embed service spreads a model's calls over two Triton processes, and what a slow one gets.

    python bench/triton_replicas.py [--seconds 10] > result.json

Starts two Tritons (A and B) on free ports, one embed service whose models name both (services/common/
triton_pool.py: the ready endpoint with the fewest calls in flight takes the next call) and the edge, and
sends single-sentence embeddings requests through the edge, closed-loop, to:
- `embed-echo` on A only: the reference, one Triton;
- `embed-echo` on A and B, both instant;
- `embed-uneven` on A and B, where B's copy sleeps 100 ms per execution (bench/triton_models/
  embed-echo-slow): round robin would send it half the calls and hold a client for 100 ms each time.
For each point: requests/s and latency through the edge, and what each Triton answered (its own
statistics), with their shares: Triton requests (the service merges concurrent requests into one Triton
call) and rows (sentences). Prints one JSON document.
"""

from __future__ import annotations

import json
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BENCH_MODELS, PROCESSES, bench_main, closed_loop, free_port, summarize, triton_processes
from bench.embeddings import edge_path, sentence
from launcher.stack import LocalStack
from tritongate.settings import Settings, default_models_dir
from tritongate.triton_local import TritonProcess

TOKENIZER = "all-minilm-l6-v2"
# Each Triton's models: the name it serves → the model folder.
REPOSITORIES = {"A": {"embed-echo": "embed-echo", "embed-uneven": "embed-echo"},
                "B": {"embed-echo": "embed-echo", "embed-uneven": "embed-echo-slow"}}
POINTS = [("embed-echo-one", 8), ("embed-echo", 8), ("embed-echo", 32), ("embed-uneven", 8), ("embed-uneven", 32)]


def two_tritons(root: Path) -> AbstractContextManager[dict[str, TritonProcess]]:
    return triton_processes(root, {name: {model: BENCH_MODELS / folder for model, folder in models.items()}
                                   for name, models in REPOSITORIES.items()})


@contextmanager
def stack_on(tritons: dict[str, TritonProcess], root: Path) -> Iterator[LocalStack]:
    """The embed service and the edge, the models pointed at both Tritons (`embed-echo-one` at A only)."""
    both = [tritons[name].grpc_url for name in REPOSITORIES]
    entry = {"path": str(default_models_dir() / TOKENIZER), "max_tokens": 256, "output_name": "sentence_embedding"}
    config = {"embedding": [
        dict(entry, name="embed-echo-one", triton_model="embed-echo", url=tritons["A"].grpc_url),
        dict(entry, name="embed-echo", url=both[0], grpc_url=both),
        dict(entry, name="embed-uneven", url=both[0], grpc_url=both),
    ]}
    (root / "model_config.json").write_text(json.dumps(config))
    settings = Settings(config_file=root / "model_config.json", edge_port=free_port(), embed_port=free_port(),
                        llm_port=free_port(), rerank_port=free_port(), uvicorn_log_level="warning")
    processes = {"edge": PROCESSES["edge"], "embed": PROCESSES["services"]}
    with LocalStack(settings, triton=tritons["A"], log_dir=root / "logs", processes=processes) as stack:
        yield stack


def answered(triton: TritonProcess, model: str) -> tuple[int, int]:
    """Requests `triton` has answered for `model`, and the rows (sentences) they held (its statistics)."""
    url = f"http://127.0.0.1:{triton.http_port}/v2/models/{model}/stats"
    with urllib.request.urlopen(url, timeout=5) as response:
        stats = json.load(response)["model_stats"]
    return (sum(int(s["inference_stats"]["success"]["count"]) for s in stats),
            sum(int(s["inference_count"]) for s in stats))


async def point(http: aiohttp.ClientSession, tritons: dict[str, TritonProcess], model: str, concurrency: int,
                seconds: float) -> dict[str, Any]:
    triton_model = "embed-echo" if model == "embed-echo-one" else model
    before: dict[str, tuple[int, int]] = {}

    def started() -> None:
        before.update({name: answered(triton, triton_model) for name, triton in tritons.items()})

    path = edge_path(http, model)
    latencies, elapsed = await closed_loop(lambda i: path([sentence(i)]), concurrency, seconds, started=started)
    row: dict[str, Any] = {"model": model, "concurrency": concurrency, "edge": summarize(latencies, elapsed, 1)}
    after = {name: answered(triton, triton_model) for name, triton in tritons.items()}
    for i, what in enumerate(("triton_requests", "triton_rows")):
        counts = {name: after[name][i] - before[name][i] for name in tritons}
        total = sum(counts.values())
        row[what] = counts
        row[f"{what}_share"] = {name: round(n / total, 3) if total else 0.0 for name, n in counts.items()}
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


async def run(seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tritongate-bench-") as tmp, two_tritons(Path(tmp)) as tritons, \
            stack_on(tritons, Path(tmp)) as stack:
        async with aiohttp.ClientSession(stack.edge_url, connector=aiohttp.TCPConnector(limit=64)) as http:
            results = [await point(http, tritons, model, concurrency, seconds) for model, concurrency in POINTS]
    return {"benchmark": "triton_replicas", "seconds_per_point": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run)
