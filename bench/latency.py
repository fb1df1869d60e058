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

What belongs to the machine is measured, not assumed: `machine_floor` times a bare FastAPI server over
HTTP and a bare grpc.aio call (bench/cpu_budget.py's), and a one-byte round trip between two processes
over a socket pair (no Python framework: what a wake-up costs), one call after another, back to back and
after 15 ms with both processes idle. The edge path crosses one hop of each kind more than the direct path,
so `gateway_own_p50_ms` is what the edge added less that floor (back to back for `embed-echo`, after
an idle wait for the models that take 15 ms).
"""

from __future__ import annotations

import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
from transformers import AutoTokenizer
from tritonclient.grpc.aio import InferenceServerClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BENCH_MODELS, CpuMeter, Path_, bench_main, closed_loop, private_stack, summarize
from bench.cpu_budget import bare_grpc, bare_http
from bench.embeddings import direct_path, edge_path, sentence
from tritongate.embed.v1 import embed_pb2, embed_pb2_grpc
from tritongate.settings import default_models_dir

TOKENIZER = "all-minilm-l6-v2"
MODELS = ["embed-echo", "embed-echo-wait", "all-minilm-l6-v2"]
MODEL_WAIT_S = 0.015  # how long embed-echo-wait (and about how long MiniLM) keeps the gateway waiting


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


def socket_round_trip(calls: int, idle_s: float = 0.0) -> dict[str, float]:
    """p50 of a one-byte round trip to a forked echo process over a socket pair, each after `idle_s`."""
    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:  # the echo: blocking reads, no event loop
        ours.close()
        while byte := theirs.recv(1):
            theirs.send(byte)
        os._exit(0)
    theirs.close()
    latencies = []
    try:
        for i in range(calls + 200):
            if idle_s:
                time.sleep(idle_s)
            start = time.perf_counter()
            ours.send(b"x")
            ours.recv(1)
            if i >= 200:  # warmed up
                latencies.append(time.perf_counter() - start)
    finally:
        ours.close()
        os.waitpid(child, 0)
    return {"round_trip_p50_us": round(statistics.median(latencies) * 1e6, 1)}


async def machine_floor(seconds: float) -> dict[str, Any]:
    """A bare HTTP hop and a bare gRPC hop at concurrency 1, back to back and after an idle wait."""
    idle_calls = max(50, int(seconds / MODEL_WAIT_S))
    floor = {"back_to_back": {"http": await bare_http(), "grpc": await bare_grpc(),
                              "socket": socket_round_trip(3000)},
             "after_idle": {"http": await bare_http(idle_calls, MODEL_WAIT_S),
                            "grpc": await bare_grpc(idle_calls, MODEL_WAIT_S),
                            "socket": socket_round_trip(idle_calls, MODEL_WAIT_S)}}
    for hops in floor.values():
        hops["both_p50_ms"] = round((hops["http"]["round_trip_p50_us"] + hops["grpc"]["round_trip_p50_us"]) / 1000, 3)
    print({"machine_floor": floor}, file=sys.stderr, flush=True)
    return floor


async def run(seconds: float) -> dict[str, Any]:
    floor = await machine_floor(seconds)
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
            hops = floor["back_to_back" if model == "embed-echo" else "after_idle"]
            row["gateway_own_p50_ms"] = round(row["added_p50_ms"]["edge"] - hops["both_p50_ms"], 2)
            print(row, file=sys.stderr, flush=True)
            results.append(row)
        await http.close()
        await channel.close(grace=None)
        await triton.close()
    return {"benchmark": "latency", "seconds_per_path": seconds, "machine_floor": floor, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run)
