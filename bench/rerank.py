"""Rerank throughput and latency: through the edge vs straight to Triton, same model, same documents.

    python bench/rerank.py [--seconds 10] > result.json

Starts its own Triton (only the demo reranker), rerank service and edge on free ports. One query with
20, 100 and 500 documents of about 100 tokens per request. The direct path tokenizes the pairs with
the same tokenizer, sends them to Triton in requests of the model's batch size (64) concurrently, and
sorts the scores. Prints one JSON document; ratio = edge / direct.
Each path also reports what the model cost Triton: its processes' CPU per request and the rows per
model execution.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from transformers import AutoTokenizer
from tritonclient.grpc.aio import InferenceServerClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import Requests, bench_main, compare, private_stack
from services.common.triton import make_input
from tritongate.settings import default_models_dir

MODEL = "minilm-rerank"
QUERY = "Which rules govern the wholesale and storage of finished oil in the province?"
TOPICS = ["finished oil wholesale", "river flood defences", "bakery opening hours", "laptop repair",
          "storage licences", "market supervision", "school timetables", "fair competition"]
WORKLOADS = [(20, 1), (100, 1), (500, 1), (100, 4)]  # (documents per request, concurrency)


def document(i: int) -> str:
    """About 100 tokens of varied, partly relevant text."""
    topic = TOPICS[i % len(TOPICS)]
    return (f"Article {i} on {topic}. " + f"The department responsible for {topic} shall publish rules, "
            "keep records of every operator, inspect premises at least once a year, and report "
            f"violations to the competent authority within ten working days. Case {i}: " * 3)[:600]


async def run(seconds: float) -> dict[str, Any]:
    path = str(default_models_dir() / "all-minilm-l6-v2")
    entry = {"name": MODEL, "path": path, "max_tokens": 256, "output_config": {"name": "logits"}}
    with private_stack({"rerank": [entry]}, [MODEL]) as stack:
        assert stack.triton is not None
        tokenizer = AutoTokenizer.from_pretrained(path)
        triton = InferenceServerClient(stack.triton.grpc_url)
        http = aiohttp.ClientSession(stack.edge_url, connector=aiohttp.TCPConnector(limit=64))

        async def direct(documents: list[str]) -> None:
            async def chunk(part: list[str]) -> np.ndarray:
                encoded = tokenizer([QUERY] * len(part), part, padding=True, truncation="only_second",
                                    max_length=256, return_tensors="np")
                result = await triton.infer(MODEL, [make_input(name, encoded[name].astype(np.int64))
                                                    for name in ("input_ids", "attention_mask", "token_type_ids")])
                return result.as_numpy("logits")[:, 0]

            logits = await asyncio.gather(*(chunk(documents[i:i + 64]) for i in range(0, len(documents), 64)))
            np.argsort(-1 / (1 + np.exp(-np.concatenate(logits))))

        async def edge(documents: list[str]) -> None:
            async with http.post("/v1/rerank", json={"model": MODEL, "query": QUERY, "documents": documents}) as r:
                r.raise_for_status()
                await r.read()

        results = [
            await compare(Requests(size, document), concurrency, {"direct_triton": direct, "edge": edge}, seconds,
                          warmup=3, model=MODEL)
            for size, concurrency in WORKLOADS
        ]
        await http.close()
        await triton.close()
    return {"benchmark": "rerank", "model": MODEL, "seconds_per_point": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run)
