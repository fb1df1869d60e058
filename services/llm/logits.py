"""Log probabilities from the logits a token-level backend returns: TensorRT-LLM's `context_logits` and
`generation_logits` (and the same optional tensors on a FasterTransformer-style model that declares them).
One log-softmax for both backends, in float64 so that a 49k-word vocabulary sums without loss; the logits
themselves come as the backend computed them (FP32, or FP16 with `logits_datatype` TYPE_FP16).

- Context logits [1, prompt length, vocab]: row i scores the token after prompt token i, so prompt token
  i > 0 gets row i - 1; the first prompt token has no log probability (OpenAI and vLLM: null).
- Generation logits [1, beams, tokens, vocab]: row j scores generated token j of the response (beam 0).
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from services.common.errors import ServiceError
from services.llm.backends import Knob, PromptLogprob, Sampling, Step

CONTEXT_LOGITS, GENERATION_LOGITS = "context_logits", "generation_logits"
RETURN_CONTEXT, RETURN_GENERATION = "return_context_logits", "return_generation_logits"
# The knobs logits give: the prompt's log probabilities from the context logits (a TensorRT-LLM engine built
# with gather_context_logits), alternatives per generated token from the generation logits.
LOGIT_KNOBS: dict[Knob, tuple[str, str]] = {"prompt_logprobs": (RETURN_CONTEXT, CONTEXT_LOGITS),
                                            "top_logprobs": (RETURN_GENERATION, GENERATION_LOGITS)}


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """Log probabilities of each row of logits [..., vocab], as float64."""
    rows = rows.astype(np.float64, copy=False)
    shifted = rows - rows.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _top(row: np.ndarray, k: int) -> list[tuple[int, float]]:
    """The `k` most likely tokens of one row of log probabilities, most likely first."""
    if k <= 0:
        return []
    k = min(k, row.shape[-1])
    ids = np.argpartition(-row, k - 1)[:k]
    ids = ids[np.argsort(-row[ids], kind="stable")]
    return [(int(i), float(row[i])) for i in ids]


def prompt_logprobs(context_logits: np.ndarray, prompt: Sequence[int], top: int, model: str) -> list[PromptLogprob]:
    """Each prompt token's log probability and `top` alternatives from `context_logits` [1, len, vocab] (or
    [len, vocab]); INTERNAL when the logits do not cover the prompt."""
    rows = context_logits.reshape(-1, context_logits.shape[-1]) if context_logits.size else context_logits
    if context_logits.ndim < 2 or rows.shape[0] < len(prompt):
        raise ServiceError(grpc.StatusCode.INTERNAL,
                           f"Triton model `{model}` returned context_logits of shape {list(context_logits.shape)} "
                           f"for a prompt of {len(prompt)} tokens")
    result = [PromptLogprob(prompt[0], None)] if prompt else []
    if len(prompt) > 1:
        log_probs = log_softmax(rows[: len(prompt) - 1])
        for i, token in enumerate(prompt[1:]):
            row = log_probs[i]
            result.append(PromptLogprob(token, float(row[token]), _top(row, top)))
    return result


def token_logprobs(generation_logits: np.ndarray, tokens: Sequence[int], top: int
                   ) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """The log probabilities of `tokens` (a response's new tokens, beam 0) and `top` alternatives at each,
    from that response's `generation_logits` [1, beams, n, vocab]: its last len(tokens) rows."""
    if not tokens:
        return [], []
    rows = generation_logits.reshape(-1, generation_logits.shape[-2], generation_logits.shape[-1])[0]
    log_probs = log_softmax(rows[-len(tokens):])
    return ([float(row[token]) for row, token in zip(log_probs, tokens, strict=True)],
            [_top(row, top) for row in log_probs])


def first_prompt_logprobs(result: Mapping[str, np.ndarray], prompt: Sequence[int], top: int, model: str
                          ) -> list[PromptLogprob]:
    """The prompt's log probabilities from a backend's first response; INTERNAL when it has no context logits
    (the request asked for them)."""
    logits = result.get(CONTEXT_LOGITS)
    if logits is None:
        raise ServiceError(grpc.StatusCode.INTERNAL,
                           f"Triton model `{model}` returned no context_logits although the request asked for them")
    return prompt_logprobs(logits, prompt, top, model)


def has_logits(inputs: Container[str], outputs: Container[str], knob: Knob) -> bool:
    """Whether a model declares the flag and the logits output behind a log-probability knob (both
    TensorRT-LLM interfaces, and FasterTransformer-style models that add them)."""
    flag, output = LOGIT_KNOBS[knob]
    return flag in inputs and output in outputs


def logit_flags(sampling: Sampling) -> dict[str, Any]:
    """The `return_*_logits` inputs a request's log probabilities need (None: not sent)."""
    return {RETURN_CONTEXT: True if sampling.prompt_logprobs else None,
            RETURN_GENERATION: True if sampling.logprobs and sampling.top_logprobs else None}


def logit_outputs(sampling: Sampling) -> list[str]:
    """The logits outputs a request's log probabilities need."""
    flags = logit_flags(sampling)
    return [output for flag, output in ((RETURN_CONTEXT, CONTEXT_LOGITS), (RETURN_GENERATION, GENERATION_LOGITS))
            if flags[flag]]


def add_alternatives(step: Step, result: Mapping[str, np.ndarray], sampling: Sampling) -> None:
    """A token step's alternatives (and, where the backend sent no log probabilities, its tokens' own) from
    the response's generation logits."""
    logits = result.get(GENERATION_LOGITS)
    if logits is None or not sampling.top_logprobs or not step.token_ids or logits.ndim < 2:
        return
    values, step.top_logprobs = token_logprobs(logits, step.token_ids, sampling.top_logprobs)
    if step.logprobs is None:
        step.logprobs = values
