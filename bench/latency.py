"""Where the time of one request goes: single-sentence embeddings requests one after another
(concurrency 1), straight to Triton, to the embed service over gRPC, and through the edge over HTTP.

    python bench/latency.py [--seconds 10] > result.json

Three models behind the same Triton, with the same tokenizer and tensors:
- `embed-echo` answers in microseconds: the gateway's processes go from one request to the next;
- `embed-echo-wait` takes 15 ms per request without using the CPU: the gateway's processes wait between
  requests, as in front of a real model, but nothing competes with them for the cores;
- `all-minilm-l6-v2`, the demo model, takes about as long on a CPU and uses one core meanwhile.
The gateway does the same work per request in front of all three. `added_p50_ms` says what each hop
added to the direct path's median (the embed service: its gRPC hop and its work; the edge: the HTTP hop
and the edge's work on top of that), beside the CPU the gateway's processes spent per request.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from transformers import AutoTokenizer
from tritonclient.grpc.aio import InferenceServerClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BENCH_MODELS, CpuMeter, Path_, bench_main, closed_loop, private_stack, summarize
from bench.embeddings import direct_path, edge_path, sentence
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc
from tritongate.settings import default_models_dir

TOKENIZER = "all-minilm-l6-v2"
MODELS = ["embed-echo", "embed-echo-wait", "all-minilm-l6-v2"]


def service_path(channel: grpc.aio.Channel, model: str) -> Path_:
    """The embed service's Embed RPC, as the edge calls it for one request."""
    stub = embed_pb2_grpc.EmbedServiceStub(channel)

    async def service(batch: list[str]) -> None:
        await stub.Embed(embed_pb2.EmbedRequest(model=model, texts=embed_pb2.TextBatch(texts=batch)), timeout=30)
    return service


async def one_by_one(path: Path_, seconds: float) -> dict[str, Any]:
    meter = CpuMeter()

    async def call(i: int) -> None:
        await path([sentence(i)])

    latencies, elapsed = await closed_loop(call, 1, seconds, warmup=30, started=meter.start)
    row: dict[str, Any] = dict(summarize(latencies, elapsed, 1))
    row["p90_ms"] = round(sorted(latencies)[int(len(latencies) * 0.9)] * 1000, 2)
    row["cpu_us_per_request"] = meter.per(len(latencies))
    return row


async def run(seconds: float) -> dict[str, Any]:
    folder = str(default_models_dir() / TOKENIZER)
    entries = [{"name": model, "path": folder, "max_tokens": 256, "output_name": "sentence_embedding"}
               for model in MODELS]
    results = []
    with private_stack({"embedding": entries}, MODELS, (BENCH_MODELS,)) as stack:
        assert stack.triton is not None
        tokenizer = AutoTokenizer.from_pretrained(folder)
        triton = InferenceServerClient(stack.triton.grpc_url)
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{stack.settings.embed_port}")
        http = aiohttp.ClientSession(stack.edge_url)
        for model in MODELS:
            paths = {"direct_triton": direct_path(tokenizer, triton, model),
                     "embed_service": service_path(channel, model), "edge": edge_path(http, model)}
            row: dict[str, Any] = {"model": model}
            for name, path in paths.items():
                row[name] = await one_by_one(path, seconds)
            direct = row["direct_triton"]["p50_ms"]
            row["added_p50_ms"] = {"embed_service": round(row["embed_service"]["p50_ms"] - direct, 2),
                                   "edge": round(row["edge"]["p50_ms"] - direct, 2)}
            print(row, file=sys.stderr, flush=True)
            results.append(row)
        await http.close()
        await channel.close(grace=None)
        await triton.close()
    return {"benchmark": "latency", "seconds_per_path": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run)
