"""The llm service's own Python per streamed token: `LanguageModel.generate` for concurrent streams, the
backend's steps played from memory (one token per turn of the event loop, as Triton's messages wake
it), with no gRPC on either side: what the stop checks, detokenizer, deltas, merging and the response
messages cost, apart from the runtime's cost per gRPC message that `bench/streaming.py` includes.

    python bench/llm_cpu.py [--seconds 4] > result.json

The model's metadata comes from the tests' fake Triton (tests/support/fake_triton.py, FasterTransformer's
echo model); the tokenizer is the demo LLM's.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_main
from services.llm.backends import Sampling, Step
from services.llm.model import LanguageModel
from tests.support.fake_triton import FakeTriton, ft_echo_model
from tests.support.stack import DEMO_LLM
from tritongate.config import LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2
from tritongate.settings import default_models_dir

TOKENS = 64  # per stream
STREAMS = (1, 16, 64)


async def point(llm: LanguageModel, streams: int, seconds: float) -> dict[str, Any]:
    request = llm_pb2.GenerateRequest(model="m", max_tokens=TOKENS,
                                      prompts=llm_pb2.Prompts(prompts=[llm_pb2.Prompt(text="Tell me a story.")]))

    async def one() -> int:
        return sum([response.HasField("delta") async for response in llm.generate(request, None)])

    await asyncio.gather(*(one() for _ in range(streams)))  # warm up
    cpu, start, rounds, messages = time.process_time(), time.perf_counter(), 0, 0
    while time.perf_counter() - start < seconds:
        messages += sum(await asyncio.gather(*(one() for _ in range(streams))))
        rounds += 1
    cpu, elapsed, tokens = time.process_time() - cpu, time.perf_counter() - start, rounds * streams * TOKENS
    row = {"streams": streams, "tokens": tokens, "cpu_us_per_token": round(cpu / tokens * 1e6, 1),
           "messages_per_token": round(messages / tokens, 3), "tokens_per_s": round(tokens / elapsed)}
    print(row, file=sys.stderr, flush=True)
    return row


async def run(seconds: float) -> dict[str, Any]:
    async with FakeTriton({"m": ft_echo_model()}) as triton:
        entry = LlmModel(name="m", url=triton.address, path=str(default_models_dir() / DEMO_LLM))
        llm = LanguageModel(entry, ModelInfo(name="m", max_len=4096), triton.client)
        await llm.ensure_ready()
        story = llm.tokenize("Once upon a time a fox ran through the woods, far from the lazy dog.", special=False)

        async def steps(prompt: list[int], sampling: Sampling, timeout: float | None, text: str = ""
                        ) -> AsyncIterator[Step]:
            for i in range(sampling.max_new_tokens):
                await asyncio.sleep(0)  # each token wakes the service on its own, as a Triton message does
                yield Step(token_ids=[story[i % len(story)]])

        llm.backend.stream = steps  # type: ignore[method-assign, assignment]
        rows = [await point(llm, streams, seconds) for streams in STREAMS]
    return {"benchmark": "llm_cpu", "tokens_per_stream": TOKENS, "results": rows}


if __name__ == "__main__":
    import uvloop

    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())  # as the service runs
    bench_main(__doc__, run)
