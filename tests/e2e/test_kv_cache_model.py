"""The simulated-KV-cache model (bench/triton_models/trtllm-kvcache) on a real Triton, behind the real llm
service and edge, driven with the openai SDK as a multi-turn chat: each turn reports as cached the full
64-token blocks of the previous turn's prompt (TensorRT-LLM's `kv_cache_reused_blocks`, turned into
`prompt_tokens_details.cached_tokens` by the service), a new conversation only the shared system prompt's,
and every turn's `prompt_tokens` is the count of the whole rendered chat tokenized at once (the service
tokenizes a next turn through its prefix cache)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from bench.common import BENCH_MODELS
from launcher.stack import LocalStack
from tests.support.ports import free_port
from tests.support.stack import stack_settings
from tritongate.settings import default_cache_dir
from tritongate.triton_local import TritonLaunch, start_triton

MODEL = "kvcache"
BLOCK = 64
SYSTEM = "You are a careful coding agent. " + "Read the files, run the tests, and report what changed. " * 40


@pytest.fixture(scope="module")
def edge_url(models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("kvcache")
    repository = root / "repository"
    repository.mkdir()
    (repository / MODEL).symlink_to(BENCH_MODELS / "trtllm-kvcache")
    triton = start_triton(TritonLaunch(
        repositories=[repository], models_dir=models_dir, cache_dir=default_cache_dir(), http_port=free_port(),
        grpc_port=free_port(), metrics_port=free_port(), log_path=root / "tritonserver.log"))
    stack = None
    try:
        triton.wait_ready(300)
        config = {"model_infos": [{"name": MODEL, "max_len": 32768}],
                  "llm": [{"name": MODEL, "path": str(models_dir / "smollm2-135m-instruct"), "url": triton.grpc_url,
                           "tokens_per_block": BLOCK}]}
        (root / "model_config.json").write_text(json.dumps(config))
        stack = LocalStack(stack_settings(root / "model_config.json", models_dir=models_dir), triton=triton,
                           log_dir=root / "logs")
        stack.start()
        yield stack.edge_url
    finally:
        if stack is not None:
            stack.stop()
        triton.stop()


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))


def turn(client: openai.OpenAI, messages: list[dict[str, str]]) -> tuple[str, Any]:
    """A streamed turn: its reply and its usage."""
    stream = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True})  # type: ignore[arg-type]
    reply, usage = [], None
    for chunk in stream:
        reply += [choice.delta.content or "" for choice in chunk.choices]
        usage = chunk.usage or usage
    assert usage is not None
    return "".join(reply), usage


def cached(usage: Any) -> int:
    return usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0


def test_a_conversations_turns_reuse_the_previous_turns_blocks(edge_url: str, tokenizer: Any) -> None:
    client = openai.OpenAI(base_url=f"{edge_url}/v1", api_key="unused", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}]
    previous: list[int] = []
    for i in range(4):
        messages.append({"role": "user", "content": f"Turn {i} of {time.time_ns()}: " + "check the module. " * 60})
        reply, usage = turn(client, messages)
        ids = prompt_ids(tokenizer, messages)
        assert usage.prompt_tokens == len(ids)
        assert cached(usage) == len(previous) // BLOCK * BLOCK  # the previous prompt's full blocks
        assert ids[: len(previous)] == previous
        assert reply
        messages.append({"role": "assistant", "content": reply})
        previous = ids

    # Another conversation with the same system prompt: only the blocks of what the two prompts share.
    other = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Something else entirely."}]
    _, usage = turn(client, other)
    ids = prompt_ids(tokenizer, other)
    shared = next(i for i, (a, b) in enumerate(zip(ids, previous, strict=False)) if a != b)
    assert shared > BLOCK
    assert cached(usage) == shared // BLOCK * BLOCK
