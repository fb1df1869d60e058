"""Long multi-turn conversations over several Tritons whose KV caches matter: which Triton serves each turn
(the llm service's routing policy), what that costs in prefill and time to first token, and what the llm
service's own work (chat template, tokenization) costs per long request.

    python bench/multiturn.py [--seconds 60] [--conversations 16] [--tritons 2] [--turns 8-20] \\
        [--prompt-tokens 8000-40000] [--growth 400] > result.json

Starts `--tritons` Triton processes, each serving a copy of bench/triton_models/trtllm-kvcache per policy
(the echo on TensorRT-LLM's interface with a simulated KV cache: a turn's time to first token is
`--prefill-us-per-token` for each prompt token its Triton has not kept, one prefill at a time per Triton;
`--kv-cache-blocks` blocks of 64 tokens kept per Triton). Then, for each policy in turn
(`TRITONGATE_TRITON_ROUTING`: least_loaded, prefix_aware), an llm service and the edge in front of all the
Tritons, and `--conversations` concurrent conversations for `--seconds`, each streamed as chat
completions through the edge. The Tritons are the same processes for every policy (nothing else differs);
each policy has its own copy of the model, so its caches start cold.

A conversation: a system prompt every conversation shares (`--shared-tokens`, an agent's instructions and
tools), a first user message of its own that brings the prompt to a size drawn from `--prompt-tokens`,
then `--turns` turns, each adding the model's reply (`--reply-tokens`) and a user message of `--growth`
tokens (a tool's output), so that the last turn stays within the range. Conversation i is the same text
for every policy; a worker that finishes one starts the next. The text is English words, counted with
the demo LLM's tokenizer, whose chat template renders it.

Per policy: requests, TTFT p50/p99 (to the first chunk with text), prefilled tokens (each turn's
`prompt_tokens` minus its `cached_tokens`, which the model reports as TensorRT-LLM does; `prefill_tokens`
sums the turns every policy served, the same prompts, and `prefill_tokens_all` all of its own), the
share of the requests the busiest Triton answered (Triton's statistics), the llm service's and the
edge's CPU per request (/proc, over the window), and the service's template + tokenization time per
request (its `Server-Timing`). A table on stderr, one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from google.protobuf import text_format
from transformers import AutoTokenizer
from tritonclient.grpc import model_config_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    BENCH_MODELS,
    PROCESSES,
    bench_main,
    free_port,
    percentile_ms,
    process_cpu,
    triton_answered,
    triton_processes,
)
from launcher.stack import LocalStack
from tritongate.settings import Settings, default_models_dir
from tritongate.triton_local import TritonProcess

POLICIES = ("least_loaded", "prefix_aware")
ROUTING_ENV = "TRITONGATE_TRITON_ROUTING"  # read by the llm service: the policy that picks a Triton
MODEL = "kvcache"  # the model id clients use
TOKENIZER = "smollm2-135m-instruct"  # the demo LLM's: its tokenizer and chat template
TOKENS_PER_BLOCK = 64  # trtllm-kvcache's
_VOCABULARY = """the a an and or but if then when while for to of in on at by with from into over under about
agent tool call result file line code test build error value function module class method return request
response server client cache token prompt model replica route policy memory queue latency stream batch data
table index query search update delete create config option default limit count total first last next
previous again check run start stop open close read write send receive parse format text number string list
map key item field record event log trace metric time second minute hour day user system message turn answer
question reason plan step goal task issue fix change patch commit branch merge review note report summary
"""
WORDS = tuple(_VOCABULARY.split())  # what the conversations say


@dataclass(frozen=True)
class Shape:
    """What the conversations look like (the command line's)."""

    shared_tokens: int
    prompt_tokens: tuple[int, int]  # the first turn's prompt at least the first, the last's at most the second
    turns: tuple[int, int]
    growth: int
    reply_tokens: int


class Words:
    """English words of about `n` tokens (the tokenizer's tokens per word, measured once)."""

    def __init__(self, tokenizer: Any) -> None:
        sample = self._join(random.Random(0).choices(WORDS, k=2000))
        self.tokens_per_word = len(tokenizer.encode(sample, add_special_tokens=False)) / 2000

    def text(self, rng: random.Random, tokens: int) -> str:
        return self._join(rng.choices(WORDS, k=max(1, round(tokens / self.tokens_per_word))))

    @staticmethod
    def _join(words: list[str]) -> str:
        """Sentences, as a file or a tool's output would have them."""
        return " ".join(w + (".\n" if i % 17 == 16 else "") for i, w in enumerate(words)).replace("\n ", "\n")


@dataclass(frozen=True)
class Conversation:
    number: int
    system: str
    users: list[str]  # one per turn


def conversation(number: int, shape: Shape, words: Words, system: str) -> Conversation:
    """Conversation `number`: the same text whichever policy serves it."""
    rng = random.Random(number)
    turns = rng.randint(*shape.turns)
    low, high = shape.prompt_tokens
    per_turn = shape.growth + shape.reply_tokens
    start = rng.randint(low, max(low, high - turns * per_turn))
    first = words.text(rng, max(start - shape.shared_tokens, shape.growth))
    users = [first, *(words.text(rng, shape.growth) for _ in range(turns - 1))]
    return Conversation(number, system, users)


@dataclass(frozen=True)
class Turn:
    conversation: int
    turn: int
    ttft: float  # seconds
    prompt_tokens: int
    cached_tokens: int
    tokenization_ms: float | None  # the service's template + tokenization (Server-Timing)

    @property
    def prefilled(self) -> int:
        return self.prompt_tokens - self.cached_tokens


def server_timing(header: str, name: str) -> float | None:
    """`name`'s duration in a Server-Timing header ("hold;dur=0.05, tokenization;dur=0.20")."""
    for part in header.split(","):
        metric, _, params = part.strip().partition(";")
        if metric == name and params.startswith("dur="):
            return float(params[4:])
    return None


async def chat_turn(http: aiohttp.ClientSession, messages: list[dict[str, str]], max_tokens: int
                    ) -> tuple[float, str, dict[str, Any], float | None]:
    """One streamed turn: its time to first text, the reply, the usage, the tokenization time."""
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    ttft: float | None = None
    reply: list[str] = []
    usage: dict[str, Any] = {}
    async with http.post("/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"turn failed with {response.status}: {await response.text()}")
        tokenization = server_timing(response.headers.get("Server-Timing", ""), "tokenization")
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                text = choice.get("delta", {}).get("content")
                if text:
                    ttft = ttft if ttft is not None else time.perf_counter() - sent
                    reply.append(text)
            usage = chunk.get("usage") or usage
    return (ttft if ttft is not None else time.perf_counter() - sent), "".join(reply), usage, tokenization


@dataclass
class Window:
    """One policy's load: the turns it served within `--seconds`."""

    turns: list[Turn] = field(default_factory=list)
    conversations: int = 0


async def converse(http: aiohttp.ClientSession, shape: Shape, make: Callable[[int], Conversation], workers: int,
                   seconds: float) -> Window:
    """`workers` conversations at a time, the next one started as one ends, until `seconds` have passed;
    a turn under way then finishes (its turn counts), none starts."""
    window = Window()
    numbers = itertools.count()
    deadline = time.perf_counter() + seconds

    async def worker() -> None:
        while time.perf_counter() < deadline:
            talk = make(next(numbers))
            window.conversations += 1
            messages = [{"role": "system", "content": talk.system}]
            for i, user in enumerate(talk.users):
                if time.perf_counter() >= deadline:
                    return
                messages.append({"role": "user", "content": user})
                ttft, reply, usage, tokenization = await chat_turn(http, messages, shape.reply_tokens)
                messages.append({"role": "assistant", "content": reply})
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
                window.turns.append(Turn(talk.number, i, ttft, usage.get("prompt_tokens", 0), cached, tokenization))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return window


def model_copy(root: Path, policy: str, kv_cache_blocks: int, prefill_us_per_token: float) -> Path:
    """trtllm-kvcache's folder for `policy`: its config with the run's cache size and prefill cost, its code
    linked (the model finds the repository by its code's real path)."""
    folder = root / "models" / f"{MODEL}-{policy}"
    folder.mkdir(parents=True)
    source = BENCH_MODELS / "trtllm-kvcache"
    config = text_format.Parse((source / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    config.parameters["kv_cache_blocks"].string_value = str(kv_cache_blocks)
    config.parameters["prefill_us_per_token"].string_value = str(prefill_us_per_token)
    (folder / "config.pbtxt").write_text(text_format.MessageToString(config))
    (folder / "1").symlink_to(source / "1")
    return folder


@contextmanager
def policy_stack(root: Path, policy: str, tritons: dict[str, TritonProcess], max_len: int) -> Iterator[LocalStack]:
    """The llm service (routing by `policy`) and the edge, the model pointed at every Triton."""
    urls = [triton.grpc_url for triton in tritons.values()]
    config = {
        "model_infos": [{"name": MODEL, "max_len": max_len}],
        "llm": [{"name": MODEL, "triton_model": f"{MODEL}-{policy}", "path": str(default_models_dir() / TOKENIZER),
                 "url": urls[0], "grpc_url": urls, "tokens_per_block": TOKENS_PER_BLOCK}],
    }
    config_file = root / f"model_config-{policy}.json"
    config_file.write_text(json.dumps(config))
    settings = Settings(config_file=config_file, edge_port=free_port(), embed_port=free_port(), llm_port=free_port(),
                        rerank_port=free_port(), uvicorn_log_level="warning")
    processes = {"edge": PROCESSES["edge"], "llm": PROCESSES["services"]}
    with LocalStack(settings, triton=next(iter(tritons.values())), log_dir=root / f"logs-{policy}",
                    processes=processes, extra_env={ROUTING_ENV: policy}) as stack:
        yield stack


def cpu_seconds(stack: LocalStack) -> dict[str, float]:
    """CPU seconds so far of the stack's llm service and edge processes (all replicas, all workers)."""
    spent = {"llm": 0.0, "edge": 0.0}
    for label, process in stack.children:
        component = label.split("-")[0]
        if component in spent:
            spent[component] += process_cpu(process.pid)
    return spent


def median_ms(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def summary(window: Window, served: dict[str, int], cpu: dict[str, float]) -> dict[str, Any]:
    turns = window.turns
    requests = len(turns)
    ttfts = sorted(t.ttft for t in turns)
    tokenization = sorted(t.tokenization_ms for t in turns if t.tokenization_ms is not None)
    total = sum(served.values())
    return {
        "requests": requests,
        "conversations": window.conversations,
        "prompt_tokens_p50": int(statistics.median(t.prompt_tokens for t in turns)) if turns else 0,
        "prompt_tokens_max": max((t.prompt_tokens for t in turns), default=0),
        "prompt_tokens_all": sum(t.prompt_tokens for t in turns),
        "prefill_tokens_all": sum(t.prefilled for t in turns),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1000, 2) if ttfts else None,
        "ttft_p99_ms": percentile_ms(ttfts, 0.99) if ttfts else None,
        "endpoint_requests": served,
        "max_endpoint_share": round(max(served.values()) / total, 3) if total else None,
        "service_cpu_ms_per_request": round(cpu["llm"] / requests * 1000, 2) if requests else None,
        "edge_cpu_ms_per_request": round(cpu["edge"] / requests * 1000, 2) if requests else None,
        "tokenization_p50_ms": median_ms(tokenization),
        "tokenization_p99_ms": round(tokenization[min(len(tokenization) - 1, int(len(tokenization) * 0.99))], 3)
        if tokenization else None,
    }


def add_common_prefill(results: dict[str, dict[str, Any]], windows: dict[str, Window]) -> int:
    """Each policy's `prefill_tokens` over the turns every policy served (the same prompts); their count."""
    keys = [{(t.conversation, t.turn) for t in window.turns} for window in windows.values()]
    common = set.intersection(*keys) if keys else set()
    for policy, window in windows.items():
        results[policy]["prefill_tokens"] = sum(t.prefilled for t in window.turns
                                                if (t.conversation, t.turn) in common)
    return len(common)


TABLE_ROWS = ("requests", "conversations", "prompt_tokens_p50", "prompt_tokens_max", "prefill_tokens",
              "prefill_tokens_all", "ttft_p50_ms", "ttft_p99_ms", "max_endpoint_share", "service_cpu_ms_per_request",
              "edge_cpu_ms_per_request", "tokenization_p50_ms", "tokenization_p99_ms")


def table(results: dict[str, dict[str, Any]]) -> str:
    width = max(map(len, TABLE_ROWS))
    lines = [f"{'':{width}}  " + "  ".join(f"{policy:>14}" for policy in results)]
    for row in TABLE_ROWS:
        lines.append(f"{row:{width}}  " + "  ".join(f"{results[policy].get(row)!s:>14}" for policy in results))
    return "\n".join(lines)


async def measure(root: Path, policy: str, tritons: dict[str, TritonProcess], shape: Shape,
                  make: Callable[[int], Conversation], conversations: int, seconds: float) -> tuple[dict[str, Any],
                                                                                                  Window]:
    model = f"{MODEL}-{policy}"
    with policy_stack(root, policy, tritons, max(65536, 2 * shape.prompt_tokens[1])) as stack:
        async with aiohttp.ClientSession(stack.edge_url, connector=aiohttp.TCPConnector(limit=conversations + 4),
                                         timeout=aiohttp.ClientTimeout(total=None)) as http:
            # The path warmed up (a connection, the service's first call), on a prompt no conversation has.
            await chat_turn(http, [{"role": "user", "content": "warm up"}], 1)
            before = {name: triton_answered(triton, model) for name, triton in tritons.items()}
            cpu_before = cpu_seconds(stack)
            window = await converse(http, shape, make, conversations, seconds)
            cpu = {k: v - cpu_before[k] for k, v in cpu_seconds(stack).items()}
            served = {name: triton_answered(triton, model) - before[name] for name, triton in tritons.items()}
    result = summary(window, served, cpu)
    print(json.dumps({"policy": policy, **result}), file=sys.stderr, flush=True)
    return result, window


def span(text: str) -> tuple[int, int]:
    """"8-20" -> (8, 20); "12" -> (12, 12)."""
    try:
        low, _, high = text.partition("-")
        values = (int(low), int(high or low))
    except ValueError:
        values = (0, -1)
    if not 1 <= values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"expected N or LOW-HIGH with 1 <= LOW <= HIGH, got {text!r}")
    return values


def policies(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or set(names) - set(POLICIES):
        raise argparse.ArgumentTypeError(f"expected policies among {','.join(POLICIES)}, got {text!r}")
    return list(dict.fromkeys(names))


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.set_defaults(seconds=60.0)
    parser.add_argument("--policies", type=policies, default=list(POLICIES), metavar="NAME,...",
                        help=f"routing policies, measured in this order (default {','.join(POLICIES)})")
    parser.add_argument("--tritons", type=int, default=2, metavar="N", help="Triton processes (default 2)")
    parser.add_argument("--conversations", type=int, default=16, metavar="N",
                        help="concurrent conversations (default 16)")
    parser.add_argument("--turns", type=span, default=(8, 20), metavar="LOW-HIGH",
                        help="turns per conversation (default 8-20)")
    parser.add_argument("--prompt-tokens", type=span, default=(8000, 40000), metavar="LOW-HIGH",
                        help="a conversation's first prompt at least LOW tokens, its last at most about HIGH "
                        "(default 8000-40000)")
    parser.add_argument("--growth", type=int, default=400, metavar="N",
                        help="tokens of the user message each later turn adds (default 400)")
    parser.add_argument("--reply-tokens", type=int, default=64, metavar="N", help="max_tokens per turn (default 64)")
    parser.add_argument("--shared-tokens", type=int, default=2000, metavar="N",
                        help="tokens of the system prompt every conversation shares (default 2000)")
    parser.add_argument("--kv-cache-blocks", type=int, default=4096, metavar="N",
                        help="KV cache blocks (64 tokens) each Triton keeps (default 4096)")
    parser.add_argument("--prefill-us-per-token", type=float, default=25.0, metavar="US",
                        help="prefill time per token not cached (default 25: 40,000 tokens in 1 s)")


async def run(seconds: float, policies: list[str], tritons: int, conversations: int, turns: tuple[int, int],
              prompt_tokens: tuple[int, int], growth: int, reply_tokens: int, shared_tokens: int,
              kv_cache_blocks: int, prefill_us_per_token: float) -> dict[str, Any]:
    shape = Shape(shared_tokens, prompt_tokens, turns, growth, reply_tokens)
    tokenizer = AutoTokenizer.from_pretrained(str(default_models_dir() / TOKENIZER))
    words = Words(tokenizer)
    system = "You are a coding agent. " + words.text(random.Random(-1), shared_tokens)

    def make(number: int) -> Conversation:
        return conversation(number, shape, words, system)

    with tempfile.TemporaryDirectory(prefix="tritongate-bench-") as tmp:
        root = Path(tmp)
        models = {policy: model_copy(root, policy, kv_cache_blocks, prefill_us_per_token) for policy in policies}
        repositories = {chr(ord("A") + i): {folder.name: folder for folder in models.values()} for i in range(tritons)}
        results: dict[str, dict[str, Any]] = {}
        windows: dict[str, Window] = {}
        with triton_processes(root, repositories) as processes:
            for policy in policies:
                results[policy], windows[policy] = await measure(root, policy, processes, shape, make, conversations,
                                                                 seconds)
    common = add_common_prefill(results, windows)
    print(table(results), file=sys.stderr, flush=True)
    return {"benchmark": "multiturn", "seconds": seconds, "tritons": tritons, "conversations": conversations,
            "turns": list(turns), "prompt_tokens": list(prompt_tokens), "growth": growth, "reply_tokens": reply_tokens,
            "shared_tokens": shared_tokens, "kv_cache_blocks": kv_cache_blocks,
            "prefill_us_per_token": prefill_us_per_token, "common_turns": common, "policies": results}


if __name__ == "__main__":
    bench_main(__doc__, run, arguments)
