"""Log probabilities on every demo LLM, end to end (HTTP → edge → llm service → real Triton): the prompt's
(`echo` with `logprobs`, what lm-evaluation-harness sends) from TensorRT-LLM's and the demo FT model's
context logits and from the demo vLLM model's prompt log probabilities, checked against the same weights
in transformers; alternatives per generated token on each; and the text ensemble's refusal.

`validate` is not applied to echoed log probabilities: OpenAI's schema types `token_logprobs` as numbers,
while the API (and vLLM) answer null for the prompt's first token, as here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.stack import DEMO_LLMS
from tests.support.reference_lm import ReferenceLM
from tests.support.streams import stream_chunks

SCORED = [DEMO_LLMS["fastertransformer"], DEMO_LLMS["tensorrt_llm"], DEMO_LLMS["vllm"]]
PROMPT = "The capital of France is Paris, and the capital of Italy is Rome."


@pytest.fixture(scope="module")
def reference(models_dir: Path) -> ReferenceLM:
    return ReferenceLM.load(models_dir)


def complete(http: httpx.Client, model: str, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/completions", json={"model": model, "temperature": 0, **body})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.parametrize("model", SCORED)
def test_the_prompt_s_log_probabilities_match_the_weights(http: httpx.Client, tokenizer: Any, reference: ReferenceLM,
                                                          model: str) -> None:
    tokens = list(tokenizer.encode(PROMPT, add_special_tokens=False))
    result = complete(http, model, prompt=PROMPT, echo=True, logprobs=1, max_tokens=0)
    choice = result["choices"][0]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert result["usage"] == {"prompt_tokens": len(tokens), "completion_tokens": 0, "total_tokens": len(tokens)}
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [tokenizer.decode([t]) for t in tokens]
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    assert logprobs["token_logprobs"][1:] == pytest.approx(reference.token_logprobs(tokens), abs=reference.tolerance)
    offsets = logprobs["text_offset"]
    assert [PROMPT[a:b] for a, b in zip(offsets, [*offsets[1:], len(PROMPT)], strict=True)] == logprobs["tokens"]
    for value, top in zip(logprobs["token_logprobs"][1:], logprobs["top_logprobs"][1:], strict=True):
        assert len(top) == 1 and max(top.values()) >= value - 1e-6  # the most likely token at each position


@pytest.mark.parametrize("model", SCORED)
def test_lm_eval_s_request_scores_the_prompt_and_keeps_the_generated_token_last(
        http: httpx.Client, tokenizer: Any, reference: ReferenceLM, model: str) -> None:
    """lm-evaluation-harness's `local-completions` loglikelihood request: token ids, `max_tokens` 1, and the
    last entry dropped as the generated token's (also when it is the end id)."""
    for text in (PROMPT, "Hello."):
        tokens = list(tokenizer.encode(text, add_special_tokens=False))
        result = complete(http, model, prompt=[tokens], echo=True, logprobs=1, max_tokens=1, seed=1234)
        logprobs = result["choices"][0]["logprobs"]
        assert len(logprobs["token_logprobs"]) == len(tokens) + 1, logprobs["tokens"]
        assert logprobs["token_logprobs"][1:-1] == pytest.approx(reference.token_logprobs(tokens),
                                                                 abs=reference.tolerance)
        assert result["usage"]["completion_tokens"] == 1


@pytest.mark.parametrize("model", SCORED)
def test_a_scored_text_whose_next_token_is_the_end_id_keeps_that_token_last(
        http: httpx.Client, tokenizer: Any, reference: ReferenceLM, model: str) -> None:
    """lm-evaluation-harness drops the last entry as the generated token's: when that token is the end id
    (which TensorRT-LLM leaves out of its output), its entry must still be there."""
    answered = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"}]
    tokens = list(tokenizer.encode(tokenizer.apply_chat_template(answered, tokenize=False), add_special_tokens=False))
    while tokens and reference.next_token(tokens) != tokenizer.eos_token_id:  # end the text where the end id comes next
        tokens.pop()
    assert len(tokens) > 5, "no position where the demo LLM ends the text"
    result = complete(http, model, prompt=[tokens], echo=True, logprobs=1, max_tokens=1)
    choice = result["choices"][0]
    assert len(choice["logprobs"]["tokens"]) == len(tokens) + 1
    assert choice["logprobs"]["tokens"][-1] == tokenizer.eos_token and choice["finish_reason"] == "stop"
    assert choice["logprobs"]["token_logprobs"][1:-1] == pytest.approx(reference.token_logprobs(tokens),
                                                                       abs=reference.tolerance)


@pytest.mark.parametrize("model", SCORED)
def test_a_stream_sends_the_echo_with_its_log_probabilities_first(http: httpx.Client, tokenizer: Any,
                                                                  model: str) -> None:
    tokens = list(tokenizer.encode(PROMPT, add_special_tokens=False))
    chunks = stream_chunks(http, "/v1/completions", {"model": model, "prompt": PROMPT, "echo": True, "logprobs": 0,
                                                     "max_tokens": 3, "temperature": 0, "stream": True,
                                                     "stream_options": {"include_usage": True}})
    first = chunks[0]["choices"][0]
    assert first["text"].startswith(PROMPT)
    assert first["logprobs"]["tokens"][:len(tokens)] == [tokenizer.decode([t]) for t in tokens]
    assert first["logprobs"]["token_logprobs"][0] is None
    entries = [e for c in chunks if c["choices"] for e in (c["choices"][0]["logprobs"] or {}).get("token_logprobs", [])]
    assert len(entries) == len(tokens) + chunks[-1]["usage"]["completion_tokens"]  # each generated token's too


@pytest.mark.parametrize("model", SCORED)
def test_alternatives_of_generated_tokens(http: httpx.Client, model: str) -> None:
    result = complete(http, model, prompt=PROMPT, logprobs=3, max_tokens=3)
    logprobs = result["choices"][0]["logprobs"]
    assert len(logprobs["tokens"]) == 3
    for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"],
                                 strict=True):
        assert len(top) == 3 and list(top.values()) == sorted(top.values(), reverse=True)
        assert top[token] == pytest.approx(value, abs=1e-4)  # greedy: the chosen token is the most likely


def test_the_text_ensemble_refuses_echo_with_logprobs(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json={"model": DEMO_LLMS["tensorrt_llm_text"], "prompt": PROMPT,
                                                  "echo": True, "logprobs": 1, "max_tokens": 0})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "logprobs"
