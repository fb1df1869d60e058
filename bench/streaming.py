"""Streaming generation: time to first token and streamed tokens/s, through the edge vs straight to
Triton over gRPC, same model, same prompts, in one run.

    python bench/streaming.py [--seconds 10] [--echo-models NAME,...] [--echo-streams 1,16,64] [--llm-streams 1,4]

Starts its own Triton (the echo model of each Triton LLM interface from the test repository, and the
SmolLM2 demo), llm service and edge on free ports. The echo models are deterministic and cost nothing
per token, so what is measured is the path: one token per response, at 1, 16 and 64 concurrent
streams, on each backend's interface (FasterTransformer, TensorRT-LLM, its ensemble/BLS text interface,
vLLM). SmolLM2 (greedy, on this CPU, FasterTransformer's interface) shows a real model at 1 and 4 streams.

The direct path is what a minimal client of that interface would do, one decoupled request per gRPC
stream: FasterTransformer, token ids in, diff the cumulative `output_ids` by `sequence_length` and decode
the new tokens; TensorRT-LLM, token ids in, decode each response's new `output_ids`; the ensemble,
`text_input` + `max_tokens` in, a `text_output` delta per response; vLLM, `text_input` + JSON
`sampling_parameters` in, a `text_output` delta per response. The edge path is POST /v1/completions
with "stream": true. Each point runs closed-loop for
`--seconds` per path; tokens are counted as they arrive within that window (requests still running
at its end finish uncounted). Prints one JSON document; ratio = edge / direct.

`--stream-interval-ms MS` measures each point a third time, through a second entry of the same Triton
model with that `stream_interval_ms` (docs/configuration.md): the edge path with and without it, in one run.

On a GPU server: `--device`, `--max-active` and `--load-processes` (bench/common.py), SmolLM2 at more
streams and tokens (`--echo-streams "" --llm-streams 1,16,64,256 --llm-max-tokens 128`; docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
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

from bench.common import CpuMeter, bench_main, percentile_ms, private_stack, ratio
from bench.load import Load, LoadTarget, load_processes
from services.common.triton import make_input
from tritongate.settings import default_models_dir

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = "smollm2-135m-instruct"
ECHOES = ("ft-echo", "trtllm-echo", "trtllm-text-echo", "vllm-echo")  # one per interface, as their backends
PROMPT = "The quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill"
ECHO_STREAMS, LLM_STREAMS = "1,16,64", "1,4"  # the points: concurrent streams per echo model, for SmolLM2
MAX_TOKENS = {**dict.fromkeys(ECHOES, 64), SMOLLM2: 32}  # per request (SmolLM2's: --llm-max-tokens)

OnTokens = Callable[[int], None]
Stream = Callable[[OnTokens], Awaitable[None]]


def with_interval(model: str) -> str:
    """The id of `model`'s second entry, the one with `--stream-interval-ms`."""
    return f"{model}-interval"


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
    return summary(*await stream_load(stream, concurrency, seconds), seconds)


async def stream_load(stream: Stream, concurrency: int, seconds: float) -> tuple[int, list[float]]:
    """The tokens counted in the window and the times to first token."""
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
    # Requests still running finish (their tokens after the deadline do not count) rather than being
    # cancelled all at once: many cancellations at the same moment can crash Triton 2.51's gRPC server.
    _, late = await asyncio.wait(workers, timeout=60)
    for task in late:
        task.cancel()
    await asyncio.gather(*workers, return_exceptions=True)
    return tokens, ttfts


def summary(tokens: int, ttfts: list[float], seconds: float) -> dict[str, Any]:
    ordered = sorted(ttfts)
    return {
        "tokens_per_s": round(tokens / seconds, 1),
        "requests_started": len(ordered),
        "ttft_p50_ms": round(statistics.median(ordered) * 1000, 2) if ordered else None,
        "ttft_p90_ms": percentile_ms(ordered, 0.9) if ordered else None,
    }


def direct_request(tokenizer: Any, model: str, max_tokens: int) -> tuple[dict[str, np.ndarray], list[str],
                                                                          Callable[[Any], int]]:
    """One request on `model`'s interface: its tensors, its outputs, and a counter of the new tokens in
    each response (decoding them as a client would)."""
    if model in ("trtllm-text-echo", "vllm-echo"):
        count = EchoTokens(tokenizer)  # the echo's text repeats the prompt's tokens

        def text_delta(result: Any) -> int:
            return count(result.as_numpy("text_output").reshape(-1)[0].decode())

        if model == "vllm-echo":  # no batch dimension
            params = json.dumps({"max_tokens": max_tokens, "temperature": 0})
            return ({"text_input": np.array([PROMPT.encode()], dtype=np.object_),
                     "stream": np.array([True]), "sampling_parameters": np.array([params.encode()], dtype=np.object_)},
                    ["text_output"], text_delta)
        return ({"text_input": np.array([[PROMPT.encode()]], dtype=np.object_),
                 "max_tokens": np.array([[max_tokens]], dtype=np.int32), "stream": np.array([[True]])},
                ["text_output"], text_delta)
    prompt = tokenizer.encode(PROMPT, add_special_tokens=False)
    if model == "trtllm-echo":  # only the new tokens in each response

        def new_tokens(result: Any) -> int:
            new = result.as_numpy("output_ids").reshape(-1)[:int(result.as_numpy("sequence_length").reshape(-1)[0])]
            tokenizer.decode(new.tolist())
            return len(new)

        return ({"input_ids": np.array([prompt], dtype=np.int32),
                 "input_lengths": np.array([[len(prompt)]], dtype=np.int32),
                 "request_output_len": np.array([[max_tokens]], dtype=np.int32),
                 "streaming": np.array([[True]]), "runtime_top_k": np.array([[1]], dtype=np.int32)},
                ["output_ids", "sequence_length"], new_tokens)
    seen = len(prompt)  # FasterTransformer: the whole sequence so far in each response

    def diff(result: Any) -> int:
        nonlocal seen
        length = int(result.as_numpy("sequence_length").reshape(-1)[0])
        new = result.as_numpy("output_ids").reshape(-1)[seen:length].tolist()
        tokenizer.decode(new)
        seen = max(seen, length)
        return len(new)

    return ({"input_ids": np.array([prompt], dtype=np.uint32),
             "input_lengths": np.array([[len(prompt)]], dtype=np.uint32),
             "request_output_len": np.array([[max_tokens]], dtype=np.uint32),
             "runtime_top_k": np.array([[1]], dtype=np.uint32)},
            ["output_ids", "sequence_length"], diff)


def direct_stream(triton: InferenceServerClient, tokenizer: Any, model: str, max_tokens: int) -> Stream:
    async def stream(on_tokens: OnTokens) -> None:
        tensors, outputs, count = direct_request(tokenizer, model, max_tokens)

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {"model_name": model, "inputs": [make_input(k, v) for k, v in tensors.items()],
                   "outputs": [InferRequestedOutput(name) for name in outputs]}

        call = triton.stream_infer(requests())
        try:
            async for result, error in call:
                if error is not None:
                    raise error
                if result.as_numpy(outputs[0]) is not None:  # not an empty final response
                    on_tokens(count(result))
        finally:
            call.cancel()

    return stream


class EchoTokens:
    """Tokens in the text streamed so far, exactly, for an echo model: its text repeats the prompt's tokens."""

    def __init__(self, tokenizer: Any) -> None:
        pieces = [tokenizer.decode([t]) for t in tokenizer.encode(PROMPT, add_special_tokens=False)]
        self.ends = list(itertools.accumulate(len(piece) for piece in pieces * (64 // len(pieces) + 1)))
        self.chars = 0
        self.tokens = 0

    def __call__(self, text: str) -> int:
        self.chars += len(text)
        before = self.tokens
        self.tokens = bisect.bisect_right(self.ends, self.chars)
        return self.tokens - before


def edge_stream(http: aiohttp.ClientSession, tokenizer: Any, model: str, max_tokens: int,
                interval: bool = False) -> Stream:
    """A chunk can carry several tokens (the llm service joins what a slow reader has not taken yet).
    `interval`: the model's entry with the run's `--stream-interval-ms`."""
    body = {"model": with_interval(model) if interval else model, "prompt": PROMPT, "max_tokens": max_tokens,
            "temperature": 0, "stream": True}

    async def stream(on_tokens: OnTokens) -> None:
        count: Callable[[str], int] = EchoTokens(tokenizer) if model in ECHOES else \
            (lambda text: len(tokenizer.encode(text, add_special_tokens=False)))  # SmolLM2: about one per chunk
        async with http.post("/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.content:
                if line.startswith(b"data: {"):
                    on_tokens(count(json.loads(line[6:])["choices"][0]["text"]))

    return stream


def http_session(edge_url: str, connections: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(edge_url, connector=aiohttp.TCPConnector(limit=connections),
                                 timeout=aiohttp.ClientTimeout(total=None))


class Clients:
    """One process's clients of both paths, and the tokenizer that counts the tokens."""

    def __init__(self, target: LoadTarget, connections: int) -> None:
        self.target = target
        self.tokenizer = AutoTokenizer.from_pretrained(target.tokenizer_path)
        self.triton = InferenceServerClient(target.grpc_url)
        self.http = http_session(target.edge_url, connections)

    def stream(self, path: str, model: str, max_tokens: int) -> Stream:
        """A request on `path`: "direct_triton", "edge", or "edge_interval" (the model's entry with the
        run's `--stream-interval-ms`)."""
        if path == "direct_triton":
            return direct_stream(self.triton, self.tokenizer, model, max_tokens)
        return edge_stream(self.http, self.tokenizer, model, max_tokens, interval=path == "edge_interval")

    async def close(self) -> None:
        await self.http.close()
        await self.triton.close()


async def share(ready: Callable[[], None], target: LoadTarget, model: str, max_tokens: int, path: str,
                concurrency: int, seconds: float) -> tuple[int, list[float]]:
    """A load process's share of a point (bench.load.Load): its own clients, a warm-up, the window."""
    clients = Clients(target, max(concurrency, 1))
    try:
        stream = clients.stream(path, model, max_tokens)
        await measure(stream, 1, 1.0)  # warm up
        ready()
        return await stream_load(stream, concurrency, seconds)
    finally:
        await clients.close()


def streams(text: str) -> list[int]:
    """"1,16,64" -> [1, 16, 64]; "" -> [] (none)."""
    try:
        parsed = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        parsed = [0]
    if any(n < 1 for n in parsed):
        raise argparse.ArgumentTypeError(f"expected stream counts like 1,16,64, got {text!r}")
    return parsed


def echo_models(text: str) -> list[str]:
    """"ft-echo,vllm-echo" -> those echo models, in ECHOES' order."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    if not names or names - set(ECHOES):
        raise argparse.ArgumentTypeError(f"expected echo models among {','.join(ECHOES)}, got {text!r}")
    return [name for name in ECHOES if name in names]


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--echo-models", type=echo_models, default=list(ECHOES), metavar="NAME,...",
                        help=f"which echo models (default all: {','.join(ECHOES)})")
    parser.add_argument("--echo-streams", type=streams, default=streams(ECHO_STREAMS), metavar="N,...",
                        help=f"concurrent streams per echo model (default {ECHO_STREAMS}; \"\": no echo model)")
    parser.add_argument("--llm-streams", type=streams, default=streams(LLM_STREAMS), metavar="N,...",
                        help=f"concurrent streams on SmolLM2 (default {LLM_STREAMS}; \"\": none)")
    parser.add_argument("--llm-max-tokens", type=int, default=MAX_TOKENS[SMOLLM2], metavar="N",
                        help=f"tokens per SmolLM2 request (default {MAX_TOKENS[SMOLLM2]})")
    parser.add_argument("--stream-interval-ms", type=float, default=None, metavar="MS",
                        help="also measure each point through a second entry of the model with this "
                        "`stream_interval_ms` (its own row fields: `edge_interval`, `interval_*`)")


async def measure_path(clients: Clients, path: str, model: str, max_tokens: int, concurrency: int,
                       seconds: float) -> tuple[dict[str, Any], dict[str, float]]:
    """One path of a point, from this process or the load processes: its summary, and the gateway's CPU
    per token."""
    meter = CpuMeter()
    processes = load_processes()
    if processes:
        load = Load(share, (clients.target, model, max_tokens))
        shares = await processes.run(load, path, concurrency, seconds, meter.start)
        result = summary(sum(tokens for tokens, _ in shares), [ttft for _, ttfts in shares for ttft in ttfts],
                         seconds)
    else:
        stream = clients.stream(path, model, max_tokens)
        await measure(stream, 1, 1.0)  # warm up
        meter.start()
        result = await measure(stream, concurrency, seconds)
    await asyncio.sleep(1.0)  # a pause between points (the requests still running finish)
    return result, meter.per(int(result["tokens_per_s"] * seconds))


def add_ratios(row: dict[str, Any], cpu: dict[str, dict[str, float]]) -> None:
    """Each edge path's CPU per token, and its tokens/s and time to first token against the direct path's."""
    for name, prefix in (("edge", ""), ("edge_interval", "interval_")):
        if name not in row:
            continue
        row[f"{prefix}cpu_us_per_token"] = cpu[name]
        row[f"{prefix}tokens_per_s_ratio"] = ratio(row[name]["tokens_per_s"], row["direct_triton"]["tokens_per_s"])
        if row[name]["ttft_p50_ms"] is not None and row["direct_triton"]["ttft_p50_ms"] is not None:
            row[f"{prefix}added_ttft_p50_ms"] = round(row[name]["ttft_p50_ms"] - row["direct_triton"]["ttft_p50_ms"], 2)


async def run(seconds: float, echo_models: list[str], echo_streams: list[int], llm_streams: list[int],
              llm_max_tokens: int, stream_interval_ms: float | None) -> dict[str, Any]:
    points = [*((echo, n) for echo in echo_models for n in echo_streams), *((SMOLLM2, n) for n in llm_streams)]
    max_tokens = {**MAX_TOKENS, SMOLLM2: llm_max_tokens}
    models = list(dict.fromkeys(model for model, _ in points))
    smollm2 = str(default_models_dir() / SMOLLM2)
    entries: list[dict[str, Any]] = [{"name": name, "path": smollm2} for name in models]  # backends detected
    paths = ["direct_triton", "edge"]
    if stream_interval_ms is not None:
        paths.append("edge_interval")
        entries += [{"name": with_interval(name), "path": smollm2, "triton_model": name,
                     "stream_interval_ms": stream_interval_ms} for name in models]
    with private_stack({"llm": entries}, models, (ROOT / "tests" / "triton_models",)) as stack:
        assert stack.triton is not None
        clients = Clients(LoadTarget(stack.triton.grpc_url, stack.edge_url, smollm2),
                          max([128, *(n for _, n in points)]))
        results = []
        for model, concurrency in points:
            row: dict[str, Any] = {"model": model, "streams": concurrency, "max_tokens": max_tokens[model]}
            cpu: dict[str, dict[str, float]] = {}  # the gateway's, per path
            for name in paths:
                row[name], cpu[name] = await measure_path(clients, name, model, max_tokens[model], concurrency,
                                                          seconds)
            add_ratios(row, cpu)
            if stream_interval_ms is not None:
                row["stream_interval_ms"] = stream_interval_ms
            print(json.dumps(row), file=sys.stderr, flush=True)
            results.append(row)
        await clients.close()
    return {"benchmark": "streaming", "prompt_tokens": len(clients.tokenizer.encode(PROMPT, add_special_tokens=False)),
            "seconds_per_point": seconds, "results": results}


if __name__ == "__main__":
    bench_main(__doc__, run, arguments, load=True)
