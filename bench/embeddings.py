"""Embeddings throughput and latency: through the edge vs straight to Triton, same model, same inputs.

    python bench/embeddings.py [--seconds 10] > result.json

Starts its own Triton (only the MiniLM model), embed service and edge on free ports. The direct path
is what a minimal client would do: tokenize with the same tokenizer, one Triton request per HTTP
request, normalise. Prints one JSON document; ratio = edge / direct.
Each path also reports what the model cost Triton: its processes' CPU per request and the rows per
model execution.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from transformers import AutoTokenizer
from tritonclient.grpc.aio import InferenceServerClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Path_, bench_main, compare, private_stack
from services.common.triton import make_input
from tritongate.settings import default_models_dir

MODEL = "all-minilm-l6-v2"
WORKLOADS = [(1, 1), (1, 8), (1, 32), (16, 1), (16, 8)]  # (sentences per request, concurrency)
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


async def run(seconds: float) -> dict[str, Any]:
    entry = {"name": MODEL, "path": str(default_models_dir() / MODEL), "max_tokens": 256,
             "output_name": "sentence_embedding"}
    with private_stack({"embedding": [entry]}, [MODEL]) as stack:
        assert stack.triton is not None
        tokenizer = AutoTokenizer.from_pretrained(entry["path"])
        triton = InferenceServerClient(stack.triton.grpc_url)
        http = aiohttp.ClientSession(stack.edge_url, connector=aiohttp.TCPConnector(limit=64))
        direct, edge = direct_path(tokenizer, triton, MODEL), edge_path(http, MODEL)
        results = [
            await compare(size, concurrency, sentence, direct, edge, seconds, model=MODEL)
            for size, concurrency in WORKLOADS
        ]
        await http.close()
        await triton.close()
    return {"benchmark": "embeddings", "model": MODEL, "seconds_per_point": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run)
