"""Embeddings throughput and latency: through the edge vs straight to Triton, same model, same inputs.

    python bench/embeddings.py [--seconds 10] [--points 1x1,1x8,1x32,16x1,16x8] > result.json

Starts its own Triton (only the MiniLM model), embed service and edge on free ports. The direct path
is what a minimal client would do: tokenize with the same tokenizer, one Triton request per HTTP
request, normalise. Prints one JSON document; ratio = edge / direct.
Each path also reports what the model cost Triton: its processes' CPU per request and the rows per
model execution. On a GPU server: `--device`, `--triton-instances`, `--max-batch` and `--load-processes`
(bench/common.py), and points with more in flight (docs/benchmarks.md, "On a GPU machine").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from transformers import AutoTokenizer
from tritonclient.grpc.aio import InferenceServerClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Path_, Requests, bench_main, closed_loop, compare, private_stack
from bench.load import Load, LoadTarget
from services.common.triton import make_input
from tritongate.settings import default_models_dir

MODEL = "all-minilm-l6-v2"
WORKLOADS = "1x1,1x8,1x32,16x1,16x8"  # sentences per request x concurrency
SUBJECTS = ["The committee", "A small bakery", "Our new intern", "The river", "That old laptop", "Every morning"]
VERBS = ["approved the budget", "opened a second shop", "fixed the failing build", "flooded the valley",
         "refuses to boot", "starts with coffee"]


def sentence(i: int) -> str:
    return f"{SUBJECTS[i % 6]} {VERBS[(i // 6) % 6]} on day {i}."


def direct_path(tokenizer: Any, triton: InferenceServerClient, model: str) -> Path_:
    """What a minimal client does: tokenize, one Triton request, normalise."""
    async def direct(batch: list[str]) -> None:
        encoded = tokenizer(batch, padding=True, truncation=True, max_length=256, return_tensors="np")
        result = await triton.infer(model, [
            make_input("input_ids", encoded["input_ids"].astype(np.int64)),
            make_input("attention_mask", encoded["attention_mask"].astype(np.int64)),
            make_input("token_type_ids", encoded["token_type_ids"].astype(np.int64)),
        ])
        vectors = result.as_numpy("sentence_embedding")
        vectors = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return direct


def edge_path(http: aiohttp.ClientSession, model: str) -> Path_:
    """POST /v1/embeddings with base64 vectors, what the openai SDK asks for."""
    async def edge(batch: list[str]) -> None:
        async with http.post("/v1/embeddings", json={"model": model, "input": batch,
                                                     "encoding_format": "base64"}) as response:
            response.raise_for_status()
            await response.read()
    return edge


@asynccontextmanager
async def paths(target: LoadTarget, connections: int) -> AsyncIterator[dict[str, Path_]]:
    """Both paths, with their own clients."""
    tokenizer = AutoTokenizer.from_pretrained(target.tokenizer_path)
    triton = InferenceServerClient(target.grpc_url)
    http = aiohttp.ClientSession(target.edge_url, connector=aiohttp.TCPConnector(limit=connections))
    try:
        yield {"direct_triton": direct_path(tokenizer, triton, MODEL), "edge": edge_path(http, MODEL)}
    finally:
        await http.close()
        await triton.close()


async def share(ready: Callable[[], None], target: LoadTarget, requests: Requests, path: str, concurrency: int,
                seconds: float) -> tuple[list[float], float]:
    """A load process's share of a point (bench.load.Load)."""
    async with paths(target, max(concurrency, 1)) as both:
        send = both[path]
        return await closed_loop(lambda i: send(requests.inputs(i)), concurrency, seconds, started=ready)


def parse_points(text: str) -> list[tuple[int, int]]:
    """"1x1,16x8" -> [(1, 1), (16, 8)]: sentences per request x concurrency."""
    try:
        parsed = [tuple(int(n) for n in point.split("x")) for point in text.split(",") if point.strip()]
    except ValueError:
        parsed = []
    if not parsed or any(len(p) != 2 or min(p) < 1 for p in parsed):
        raise argparse.ArgumentTypeError(f"expected points like 1x1,16x8 (sentences x concurrency), got {text!r}")
    return parsed  # type: ignore[return-value]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--points", type=parse_points, default=parse_points(WORKLOADS), metavar="SxC,...",
                        help=f"sentences per request x concurrency (default {WORKLOADS})")


async def run(seconds: float, points: list[tuple[int, int]]) -> dict[str, Any]:
    entry = {"name": MODEL, "path": str(default_models_dir() / MODEL), "max_tokens": 256,
             "output_name": "sentence_embedding"}
    with private_stack({"embedding": [entry]}, [MODEL]) as stack:
        assert stack.triton is not None
        connections = max(64, *(concurrency for _, concurrency in points))
        target = LoadTarget(stack.triton.grpc_url, stack.edge_url, entry["path"])
        async with paths(target, connections) as both:
            results = []
            for size, concurrency in points:
                requests = Requests(size, sentence)
                results.append(await compare(requests, concurrency, both, seconds, model=MODEL,
                                             load=Load(share, (target, requests))))
    return {"benchmark": "embeddings", "model": MODEL, "seconds_per_point": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run, arguments, load=True)
