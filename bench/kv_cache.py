"""The simulated KV cache of bench/triton_models/trtllm-kvcache: what a TensorRT-LLM engine with block
reuse keeps of the prompts it served, and what prefilling the rest costs.

- `BlockCache`: a prompt is cut into blocks of `tokens_per_block` tokens; block i is named by a hash
  chained over blocks 0..i (and a salt: the LoRA task, as TensorRT-LLM reuses blocks only within one), so a
  block matches only where the whole prefix up to it matches. A new prompt reuses its leading full blocks
  that the cache holds, up to its last token (which is always computed, as the engine's context phase
  needs at least one token); then all its full blocks are stored. At most `capacity` blocks are kept, the
  least recently used evicted first, and within one prompt the later blocks count as older, so eviction
  takes a prefix's tail before its head (leaves first, as TensorRT-LLM's radix tree does).
- `Prefill`: the one engine of a model instance prefills one request at a time, `seconds_per_token` per
  token the cache did not hold, so prefills queue behind each other as they do on a busy GPU; it sleeps,
  costing no CPU.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence


def block_hashes(tokens: Sequence[int], tokens_per_block: int, salt: int | None = None) -> list[int]:
    """The chained hash of each full block of `tokens`."""
    hashes, parent = [], hash((-1 if salt is None else salt,))
    for start in range(0, len(tokens) - tokens_per_block + 1, tokens_per_block):
        parent = hash((parent, tuple(tokens[start:start + tokens_per_block])))
        hashes.append(parent)
    return hashes


class BlockCache:
    """The reusable blocks of one engine; thread-safe."""

    def __init__(self, tokens_per_block: int, capacity: int) -> None:
        if tokens_per_block < 1 or capacity < 1:
            raise ValueError("tokens_per_block and capacity must be positive")
        self.tokens_per_block = tokens_per_block
        self.capacity = capacity
        self.blocks: OrderedDict[int, None] = OrderedDict()  # least recently used first
        self.lock = threading.Lock()

    def serve(self, prompt: Sequence[int], salt: int | None = None) -> int:
        """The blocks of `prompt` reused from earlier prompts; `prompt`'s full blocks are stored."""
        hashes = block_hashes(prompt, self.tokens_per_block, salt)
        reusable = max(len(prompt) - 1, 0) // self.tokens_per_block
        with self.lock:
            reused = next((i for i, h in enumerate(hashes[:reusable]) if h not in self.blocks), reusable)
            for h in reversed(hashes):  # the head most recent: evicted last
                self.blocks[h] = None
                self.blocks.move_to_end(h)
            while len(self.blocks) > self.capacity:
                self.blocks.popitem(last=False)
        return reused

    def __len__(self) -> int:
        return len(self.blocks)


class Prefill:
    """One engine's context phase: one prompt at a time, `seconds_per_token` per token not reused."""

    def __init__(self, seconds_per_token: float) -> None:
        self.seconds_per_token = seconds_per_token
        self.lock = threading.Lock()

    def run(self, tokens: int) -> None:
        if tokens <= 0 or self.seconds_per_token <= 0:
            return
        with self.lock:
            time.sleep(tokens * self.seconds_per_token)
