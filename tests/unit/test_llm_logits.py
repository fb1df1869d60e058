"""Log probabilities from a token-level backend's logits (services/llm/logits.py): the prompt's from the
context logits, alternatives per generated token from the generation logits."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Sampling, Step
from services.llm.logits import add_alternatives, log_softmax, prompt_logprobs, token_logprobs

RNG = np.random.default_rng(7)


def reference(row: np.ndarray) -> list[float]:
    total = math.log(sum(math.exp(float(v)) for v in row))
    return [float(v) - total for v in row]


def test_log_softmax_matches_the_definition_and_survives_large_logits() -> None:
    row = RNG.normal(size=50).astype(np.float32) * 5
    assert np.allclose(log_softmax(row), reference(row), atol=1e-9)
    assert np.allclose(np.exp(log_softmax(np.array([1000.0, 1000.0]))), [0.5, 0.5])  # no overflow


def test_each_prompt_token_is_scored_by_the_row_before_it() -> None:
    logits = RNG.normal(size=(1, 4, 10)).astype(np.float32)  # [1, prompt length, vocab]
    prompt = [3, 7, 1, 9]
    result = prompt_logprobs(logits, prompt, top=2, model="m")
    assert [p.token for p in result] == prompt
    assert result[0].logprob is None and result[0].top == []  # nothing predicts the first token
    for i in range(1, 4):
        row = reference(logits[0, i - 1])
        assert result[i].logprob == pytest.approx(row[prompt[i]], abs=1e-9)
        best = sorted(range(10), key=lambda t: -row[t])[:2]
        assert [t for t, _ in result[i].top] == best
        assert [v for _, v in result[i].top] == pytest.approx([row[t] for t in best], abs=1e-9)


def test_context_logits_that_do_not_cover_the_prompt_are_a_backend_fault() -> None:
    with pytest.raises(ServiceError) as info:
        prompt_logprobs(np.zeros((1, 2, 10), np.float32), [1, 2, 3], top=0, model="m")
    assert "context_logits of shape [1, 2, 10] for a prompt of 3 tokens" in info.value.message


def test_a_response_s_new_tokens_are_its_last_generation_logits_rows() -> None:
    logits = RNG.normal(size=(1, 1, 3, 10)).astype(np.float32)  # [1, beams, tokens, vocab]
    values, tops = token_logprobs(logits, [4, 5], top=3)
    assert values == pytest.approx([reference(logits[0, 0, 1])[4], reference(logits[0, 0, 2])[5]], abs=1e-9)
    assert all(len(top) == 3 for top in tops)
    assert tops[0][0][0] == int(np.argmax(logits[0, 0, 1]))


def test_alternatives_keep_the_backend_s_own_log_probabilities() -> None:
    logits = RNG.normal(size=(1, 1, 1, 10)).astype(np.float32)
    sampling = Sampling(max_new_tokens=1, greedy=True, logprobs=True, top_logprobs=2)
    step = Step([3], logprobs=[-0.5])
    add_alternatives(step, {"generation_logits": logits}, sampling)
    assert step.logprobs == [-0.5] and step.top_logprobs is not None and len(step.top_logprobs[0]) == 2
    bare = Step([3])
    add_alternatives(bare, {"generation_logits": logits}, sampling)  # no output_log_probs: from the logits
    assert bare.logprobs == pytest.approx([reference(logits[0, 0, 0])[3]], abs=1e-9)
