"""Streaming generation: time to first token and streamed tokens/s, through the edge vs straight to
Triton over gRPC, same model, same prompts, in one run.

    python bench/streaming.py [--seconds 10] > result.json

Starts its own Triton (ft-echo from the test repository and the SmolLM2 demo), llm service and edge on
free ports. ft-echo is deterministic and costs nothing per token, so what is measured is the path:
one token per response, as FasterTransformer streams, at 1, 16 and 64 concurrent streams. SmolLM2
(greedy, on this CPU) shows a real model at 1 and 4 streams.

The direct path is what a minimal client would do: tokenize with the same tokenizer, one decoupled
request per gRPC stream with FT's tensors, diff `output_ids` by `sequence_length`, decode the new
tokens. The edge path is POST /v1/completions with "stream": true. Each point runs closed-loop for
`--seconds` per path; tokens are counted as they arrive within that window (requests still running
at its end are cancelled). Prints one JSON document; ratio = edge / direct.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from transformers import AutoTokenizer
from tritonclient.grpc import InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import CpuMeter, bench_main, private_stack, ratio
from services.common.triton import make_input
from tritongate.settings import default_models_dir

ROOT = Path(__file__).resolve().parent.parent
ECHO, SMOLLM2 = "ft-echo", "smollm2-135m-instruct"
PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill"
POINTS = [(ECHO, 1), (ECHO, 16), (ECHO, 64), (SMOLLM2, 1), (SMOLLM2, 4)]
MAX_TOKENS = {ECHO: 64, SMOLLM2: 32}

OnTokens = Callable[[int], None]
Stream = Callable[[OnTokens], Awaitable[None]]


class _Request:
    """One request's first-token clock."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.first = True

    def counter(self, ttfts: list[float], deadline: float, add: OnTokens) -> OnTokens:
        def on_tokens(n: int) -> None:
            now = time.perf_counter()
            if self.first and n:
                ttfts.append(now - self.started)
                self.first = False
            if now < deadline:
                add(n)

        return on_tokens


async def measure(stream: Stream, concurrency: int, seconds: float) -> dict[str, Any]:
    """`concurrency` workers stream one request after another for `seconds`."""
    tokens = 0
    ttfts: list[float] = []
    deadline = time.perf_counter() + seconds

    def add(n: int) -> None:
        nonlocal tokens
        tokens += n

    async def worker() -> None:
        while time.perf_counter() < deadline:
            await stream(_Request(time.perf_counter()).counter(ttfts, deadline, add))

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(seconds)
    for task in workers:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    ordered = sorted(ttfts)
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "requests_started": len(ordered),
        "ttft_p50_ms": round(statistics.median(ordered) * 1000, 2) if ordered else None,
        "ttft_p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 2) if ordered else None,
    }


def direct_stream(triton: InferenceServerClient, tokenizer: Any, model: str) -> Stream:
    async def stream(on_tokens: OnTokens) -> None:
        prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
        tensors = {"input_ids": np.array([prompt], dtype=np.uint32),
                   "input_lengths": np.array([[len(prompt)]], dtype=np.uint32),
                   "request_output_len": np.array([[MAX_TOKENS[model]]], dtype=np.uint32),
                   "runtime_top_k": np.array([[1]], dtype=np.uint32)}

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": model, "inputs": [make_input(k, v) for k, v in tensors.items()],
                   "outputs": [InferRequestedOutput("output_ids"), InferRequestedOutput("sequence_length")]}

        seen = len(prompt)
        call = triton.stream_infer(requests())
        try:
            async for result, error in call:
                if error is not None:
                    raise error
                lengths = result.as_numpy("sequence_length")
                if lengths is None:
                    continue
                length = int(lengths.reshape(-1)[0])
                new = result.as_numpy("output_ids").reshape(-1)[seen:length].tolist()
                tokenizer.decode(new)
                seen = max(seen, length)
                on_tokens(len(new))
        finally:
            call.cancel()

    return stream


class EchoTokens:
    """Tokens in the text streamed so far, exactly, for ft-echo: its text repeats the prompt's tokens."""

    def __init__(self, tokenizer: Any) -> None:
        pieces = [tokenizer.decode([t]) for t in tokenizer.encode(PROMPT, add_special_tokens=False)]
        self.ends = list(itertools.accumulate(len(piece) for piece in pieces * (MAX_TOKENS[ECHO] // len(pieces) + 1)))
        self.chars = 0
        self.tokens = 0

    def __call__(self, text: str) -> int:
        self.chars += len(text)
        before = self.tokens
        self.tokens = bisect.bisect_right(self.ends, self.chars)
        return self.tokens - before


def edge_stream(http: aiohttp.ClientSession, tokenizer: Any, model: str) -> Stream:
    """A chunk can carry several tokens (the llm service joins what a slow reader has not taken yet)."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS[model], "temperature": 0, "stream": True}

    async def stream(on_tokens: OnTokens) -> None:
        count: Callable[[str], int] = EchoTokens(tokenizer) if model == ECHO else \
            (lambda text: len(tokenizer.encode(text, add_special_tokens=False)))  # SmolLM2: about one per chunk
        async with http.post("/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.content:
                if line.startswith(b"data: {"):
                    on_tokens(count(json.loads(line[6:])["choices"][0]["text"]))

    return stream


async def run(seconds: float) -> dict[str, Any]:
    smollm2 = str(default_models_dir() / SMOLLM2)
    entries = [{"name": ECHO, "path": smollm2}, {"name": SMOLLM2, "path": smollm2}]
    with private_stack({"llm": entries}, [ECHO, SMOLLM2], (ROOT / "tests" / "triton_models",)) as stack:
        assert stack.triton is not None
        tokenizer = AutoTokenizer.from_pretrained(smollm2)
        triton = InferenceServerClient(stack.triton.grpc_url)
        http = aiohttp.ClientSession(stack.edge_url, connector=aiohttp.TCPConnector(limit=128),
                                     timeout=aiohttp.ClientTimeout(total=None))
        results = []
        for model, concurrency in POINTS:
            row: dict[str, Any] = {"model": model, "streams": concurrency, "max_tokens": MAX_TOKENS[model]}
            meter = CpuMeter()
            for name, stream in (("direct_triton", direct_stream(triton, tokenizer, model)),
                                 ("edge", edge_stream(http, tokenizer, model))):
                await measure(stream, 1, 1.0)  # warm up
                meter.start()
                row[name] = await measure(stream, concurrency, seconds)
                await asyncio.sleep(1.0)  # let cancelled requests drain out of the model
            row["cpu_us_per_token"] = meter.per(int(row["edge"]["tokens_per_s"] * seconds))
            row["tokens_per_s_ratio"] = ratio(row["edge"]["tokens_per_s"], row["direct_triton"]["tokens_per_s"])
            if row["edge"]["ttft_p50_ms"] is not None and row["direct_triton"]["ttft_p50_ms"] is not None:
                row["added_ttft_p50_ms"] = round(row["edge"]["ttft_p50_ms"] - row["direct_triton"]["ttft_p50_ms"], 2)
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
        await http.close()
        await triton.close()
    return {"benchmark": "streaming", "prompt_tokens": len(tokenizer.encode(PROMPT, add_special_tokens=False)),
            "seconds_per_point": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run)
