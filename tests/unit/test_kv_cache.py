"""The simulated KV cache of the trtllm-kvcache benchmark model (bench/kv_cache.py): chained block hashes,
reuse up to the last token, LoRA tasks apart, least recently used blocks evicted tail first."""

from __future__ import annotations

import pytest

from bench.kv_cache import BlockCache, Prefill, block_hashes

BLOCK = 4


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_blocks_chain_over_the_whole_prefix() -> None:
    a = block_hashes(tokens(12), BLOCK)
    assert len(a) == 3  # full blocks only
    assert block_hashes(tokens(13), BLOCK) == a
    changed = [99, *tokens(11, 1)]
    b = block_hashes(changed, BLOCK)
    assert b[0] != a[0]
    assert b[1] != a[1] and b[2] != a[2]  # same tokens, different prefix: different blocks
    assert block_hashes(tokens(12), BLOCK, salt=7) != a


def test_a_new_prompt_reuses_the_blocks_it_shares_up_to_its_last_token() -> None:
    cache = BlockCache(BLOCK, capacity=100)
    assert cache.serve(tokens(10)) == 0
    assert len(cache) == 2  # its full blocks are stored
    assert cache.serve(tokens(10)) == 2  # the same prompt again: both full blocks
    assert cache.serve(tokens(8)) == 1  # its last token is computed, so its last block is not reused
    assert cache.serve(tokens(9)) == 2
    assert cache.serve([*tokens(6), 50, 51, 52, 53, 54]) == 1  # diverges inside block 2
    assert cache.serve([0]) == 0


def test_a_growing_conversation_prefills_only_what_is_new() -> None:
    cache = BlockCache(BLOCK, capacity=1000)
    conversation = tokens(40)
    assert cache.serve(conversation) == 0
    for turn in range(1, 6):
        conversation += tokens(7, start=1000 * turn)
        assert cache.serve(conversation) == (len(conversation) - 7) // BLOCK  # the previous turn's full blocks


def test_lora_tasks_do_not_share_blocks() -> None:
    cache = BlockCache(BLOCK, capacity=100)
    cache.serve(tokens(20), salt=1)
    assert cache.serve(tokens(20), salt=2) == 0
    assert cache.serve(tokens(20)) == 0
    assert cache.serve(tokens(20), salt=1) == 4


def test_the_least_recently_used_prompt_goes_first_its_tail_before_its_head() -> None:
    cache = BlockCache(BLOCK, capacity=6)
    cache.serve(tokens(16, 0))  # A: 4 blocks
    cache.serve(tokens(12, 100))  # B: 3 blocks; one of A's goes: its last
    assert len(cache) == 6
    assert cache.serve(tokens(17, 0)) == 3  # A's head is still there (and A is now the most recent)
    assert cache.serve(tokens(13, 100)) == 2  # A's fourth block took B's last one


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BlockCache(0, 10)
    with pytest.raises(ValueError):
        BlockCache(4, 0)


def test_prefill_sleeps_for_the_tokens_not_reused_holding_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    prefill = Prefill(seconds_per_token=0.001)
    slept: list[tuple[float, bool]] = []
    monkeypatch.setattr("bench.kv_cache.time.sleep", lambda s: slept.append((s, prefill.lock.locked())))
    prefill.run(500)
    prefill.run(0)  # all reused: no wait for the engine
    assert slept == [(pytest.approx(0.5), True)]
    assert not prefill.lock.locked()
