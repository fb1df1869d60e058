"""The edge's own CPU per embeddings request and per streamed chunk, kept busy: the real edge app under
uvicorn, its embed calls answered at once and its Generate streams played from memory inside the process
(no service, no Triton), closed-loop load from 32 clients. This is what the edge's code costs when the
gateway is the bottleneck (a GPU server), free of the wake-ups that dominate a mostly idle process;
embeddings with the access log on and off, alternating, twice each; then streamed completions (64 deltas,
65 chunks with the finish), twice.

    python bench/edge_cpu.py [--seconds 8] > result.json
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_main, closed_loop, free_port, process_cpu, start_script

CONCURRENCY = 32

FAKED_EDGE = """
import sys
from contextlib import asynccontextmanager
import asyncio
import grpc, numpy as np, uvicorn
from edge.app import create_app
from tritongate.common.v1 import common_pb2
from tritongate.embed.v1 import embed_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import configure_logging
from tritongate.settings import Settings

configure_logging()
VECTOR = np.random.rand(1, 384).astype("<f4").tobytes()

TIMINGS = common_pb2.Timings(queue_s=0.0001, tokenization_s=0.0002, inference_s=0.001)  # as a service reports

def answer(request):
    return embed_pb2.EmbedResponse(model=request.model, embeddings=VECTOR, rows=1, dimensions=384,
                                   usage=common_pb2.Usage(prompt_tokens=12, total_tokens=12), timings=TIMINGS)

async def unary(request, timeout=None, metadata=None):
    return answer(request)

async def batch(request, timeout=None):
    return embed_pb2.EmbedBatchResponse(results=[embed_pb2.EmbedBatchResult(response=answer(item.request))
                                                 for item in request.items])

async def any_model(model, service):
    return None

TOKENS = 64
MESSAGES = [llm_pb2.GenerateResponse(accepted=llm_pb2.Accepted(prompt_tokens=10, choices=1), timings=TIMINGS),
            *(llm_pb2.GenerateResponse(delta=llm_pb2.Delta(index=0, text=" fox")) for _ in range(TOKENS - 1)),
            llm_pb2.GenerateResponse(delta=llm_pb2.Delta(index=0, text=" fox", finish_reason="length")),
            llm_pb2.GenerateResponse(usage=common_pb2.Usage(prompt_tokens=10, completion_tokens=TOKENS,
                                                            total_tokens=TOKENS + 10), timings=TIMINGS)]

class Generate:
    # A Generate call played from memory; each read waits a turn of the loop, as a gRPC read does.

    def __init__(self, request, timeout=None, metadata=None):
        self.messages = iter(MESSAGES)

    async def read(self):
        await asyncio.sleep(0)
        return next(self.messages, grpc.aio.EOF)

    def cancel(self):
        pass

app = create_app(Settings())
served = app.router.lifespan_context

@asynccontextmanager
async def lifespan(app):
    async with served(app):
        clients = app.state.edge.clients
        clients.embed.coalescer.calls.unary, clients.embed.coalescer.calls.batch = unary, batch
        clients.llm.stub.Generate = Generate
        clients.directory.route = any_model
        yield

app.router.lifespan_context = lifespan
uvicorn.run(app, port=int(sys.argv[1]), log_level="warning", loop="uvloop", http="httptools", access_log=False)
"""


def _start(port: int, access_log: bool, log: IO[bytes]) -> subprocess.Popen[bytes]:
    env = {**os.environ, "TRITONGATE_ACCESS_LOG": str(access_log).lower()}
    return start_script(FAKED_EDGE, port, env=env, stderr=log)


async def measure(seconds: float, access_log: bool, streamed: bool = False) -> dict[str, Any]:
    port = free_port()
    with tempfile.TemporaryFile() as log:  # the edge's log lines go to a file, as in a deployment
        edge = _start(port, access_log, log)
        try:
            spent, requests, elapsed = await _load(port, seconds, edge.pid, streamed)
        finally:
            edge.kill()
            edge.wait()
    row: dict[str, Any] = {"access_log": access_log, "concurrency": CONCURRENCY,
                           "requests_per_s": round(requests / elapsed, 1)}
    if streamed:
        row |= {"streamed_chunks_per_request": STREAMED_CHUNKS,
                "edge_cpu_us_per_chunk": round(spent / (requests * STREAMED_CHUNKS) * 1e6, 1)}
    else:
        row["edge_cpu_us_per_request"] = round(spent / requests * 1e6, 1)
    print(row, file=sys.stderr, flush=True)
    return row


STREAMED_CHUNKS = 65  # a chunk per delta of the fake Generate (FAKED_EDGE's TOKENS), and the finish chunk


async def _load(port: int, seconds: float, pid: int, streamed: bool) -> tuple[float, int, float]:
    """Closed-loop load on the edge at `port`: its CPU seconds, the requests answered, the seconds taken."""
    async with aiohttp.ClientSession(f"http://127.0.0.1:{port}") as http:
        async def embed(i: int) -> None:
            body = {"model": "all-minilm-l6-v2", "input": [f"The river flooded the valley on day {i}."],
                    "encoding_format": "base64"}
            async with http.post("/v1/embeddings", json=body) as response:
                response.raise_for_status()
                await response.read()

        async def stream(i: int) -> None:
            body = {"model": "any", "prompt": f"Request {i}", "max_tokens": STREAMED_CHUNKS - 1, "stream": True}
            async with http.post("/v1/completions", json=body) as response:
                response.raise_for_status()
                chunks = sum([line.startswith(b"data: {") async for line in response.content])
                assert chunks == STREAMED_CHUNKS, chunks

        send = stream if streamed else embed
        for _ in range(100):  # until uvicorn listens
            try:
                await send(0)
                break
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
        cpu: list[float] = []
        latencies, elapsed = await closed_loop(send, CONCURRENCY, seconds, warmup=20 if streamed else 200,
                                               started=lambda: cpu.append(process_cpu(pid)))
        return process_cpu(pid) - cpu[0], len(latencies), elapsed


async def run(seconds: float) -> dict[str, Any]:
    points = [await measure(seconds, on) for on in (True, False, True, False)]
    streamed = [await measure(seconds, True, streamed=True) for _ in range(2)]
    return {"benchmark": "edge_cpu", "points": points, "streamed": streamed}


if __name__ == "__main__":
    bench_main(__doc__, run)
