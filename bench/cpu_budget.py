"""CPU per request: what the gateway's processes spend, and what a bare HTTP server and a bare gRPC call
cost on this machine (the floor of any Python edge → service hop).

    python bench/cpu_budget.py [--seconds 8] > result.json

On a machine where the load client, the edge, the service and Triton share the cores, every
millisecond of CPU per request the gateway spends is taken from the model: this puts numbers on it.
CPU times come from /proc (whole process, all threads) and time.thread_time (the client's own thread).

The gateway is measured twice: in front of the demo embedding model ("gateway"), which on a CPU-only
machine keeps Triton busy while the gateway's processes idle between requests, and in front of
bench/triton_models/embed-echo ("gateway_cheap_model"), which costs Triton almost nothing, so that, as
on a GPU server, the gateway's processes are what limits the rate.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import uvloop
from grpc_health.v1 import health_pb2, health_pb2_grpc

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import BENCH_MODELS, CpuMeter, bench_main, free_port, private_stack, process_cpu, start_script
from tritongate.settings import default_models_dir

MODEL = "all-minilm-l6-v2"
CHEAP_MODEL = "embed-echo"  # MiniLM's tokenizer and tensors; vectors at a few microseconds a row
CALLS = 3000

BARE_HTTP = """
import sys, uvicorn
from fastapi import FastAPI, Request, Response
app = FastAPI()
@app.post("/v1/embeddings")
async def embeddings(request: Request) -> Response:
    await request.body()
    return Response(b'{"object": "list"}', media_type="application/json")
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", access_log=False, loop="uvloop", http="httptools")
"""

BARE_GRPC = """
import sys, grpc, uvloop
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer
async def main():
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    await server.start()
    await server.wait_for_termination()
uvloop.run(main())
"""


def per_request_us(seconds: float, requests: int) -> float:
    return round(seconds / requests * 1e6, 1)


async def _bare(source: str, call: Any, calls: int = CALLS, idle_s: float = 0.0) -> dict[str, float]:
    """Start a bare server from `source`, warm up, then time `calls` sequential calls of `call(port)`, each
    after `idle_s` with both processes idle (as when a gateway waits on a model)."""
    port = free_port()
    server = start_script(source, port)
    try:
        send = await call(port)
        for _ in range(200):
            await send()
        latencies = []
        cpu, thread = process_cpu(server.pid), time.thread_time()
        for _ in range(calls):
            if idle_s:
                await asyncio.sleep(idle_s)
            start = time.perf_counter()
            await send()
            latencies.append(time.perf_counter() - start)
        return {"server_cpu_us": per_request_us(process_cpu(server.pid) - cpu, calls),
                "client_thread_cpu_us": per_request_us(time.thread_time() - thread, calls),
                "round_trip_us": per_request_us(sum(latencies), calls),
                "round_trip_p50_us": round(statistics.median(latencies) * 1e6, 1)}
    finally:
        server.kill()
        server.wait()


async def bare_http(calls: int = CALLS, idle_s: float = 0.0) -> dict[str, float]:
    session = aiohttp.ClientSession()

    async def connect(port: int) -> Any:
        for _ in range(100):  # until uvicorn listens
            try:
                async with session.get(f"http://127.0.0.1:{port}/docs"):
                    break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)

        async def send() -> None:
            async with session.post(f"http://127.0.0.1:{port}/v1/embeddings",
                                    json={"model": MODEL, "input": ["A short sentence."]}) as response:
                await response.read()
        return send

    try:
        return await _bare(BARE_HTTP, connect, calls, idle_s)
    finally:
        await session.close()


async def bare_grpc(calls: int = CALLS, idle_s: float = 0.0) -> dict[str, float]:
    channels: list[grpc.aio.Channel] = []

    async def connect(port: int) -> Any:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        channels.append(channel)
        stub = health_pb2_grpc.HealthStub(channel)
        await channel.channel_ready()

        async def send() -> None:
            await stub.Check(health_pb2.HealthCheckRequest(), wait_for_ready=True)
        return send

    try:
        return await _bare(BARE_GRPC, connect, calls, idle_s)
    finally:
        for channel in channels:
            await channel.close(grace=None)


async def gateway(seconds: float, model: str = MODEL) -> list[dict[str, Any]]:
    """CPU per request of the edge and the embed service under closed-loop load, by concurrency."""
    entry = {"name": model, "path": str(default_models_dir() / MODEL), "max_tokens": 256,
             "output_name": "sentence_embedding"}
    rows = []
    with private_stack({"embedding": [entry]}, [model], (BENCH_MODELS,)) as stack:
        async with aiohttp.ClientSession(stack.edge_url) as http:
            async def send(i: int) -> None:
                body = {"model": model, "input": [f"The river flooded the valley on day {i}."],
                        "encoding_format": "base64"}
                async with http.post("/v1/embeddings", json=body) as response:
                    response.raise_for_status()
                    await response.read()

            for concurrency in (1, 32):
                for i in range(50):
                    await send(i)
                meter = CpuMeter()
                meter.start()
                done = 0
                deadline = time.perf_counter() + seconds

                async def worker(deadline: float = deadline) -> None:
                    nonlocal done
                    while time.perf_counter() < deadline:
                        await send(done)
                        done += 1

                await asyncio.gather(*(worker() for _ in range(concurrency)))
                row: dict[str, Any] = {"concurrency": concurrency, "requests_per_s": round(done / seconds, 1),
                                       "cpu_us_per_request": meter.per(done)}
                print(row, file=sys.stderr, flush=True)
                rows.append(row)
    return rows


async def run(seconds: float) -> dict[str, Any]:
    return {"benchmark": "cpu_budget", "model": MODEL, "bare_fastapi_http": await bare_http(),
            "bare_grpc_aio_unary": await bare_grpc(), "gateway": await gateway(seconds),
            "cheap_model": CHEAP_MODEL, "gateway_cheap_model": await gateway(seconds, CHEAP_MODEL)}


if __name__ == "__main__":
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as the edge and the services run
    bench_main(__doc__, run)
