"""The TensorRT-LLM adapter: the `tensorrt_llm` model of Triton's tensorrtllm_backend (C++ `tensorrtllm`
backend, or its Python twin), token ids in and out, always streaming (decoupled mode).

Inputs: `input_ids` [1, len], `input_lengths` and `request_output_len` [1, 1] (INT32), `streaming` true,
`exclude_input_in_output` true where declared; sampling scalars [1, 1] (`runtime_top_k`, `runtime_top_p`,
`temperature`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `min_tokens` or before
2025-05 `min_length`, `seed` or before 2025-05 `random_seed`, `return_log_probs`), `end_id`, and word
lists `stop_words_list` / `bad_words_list` [1, 2, N] (omitted when empty: TensorRT-LLM rejects FT's
"empty list"), `beam_width` for beam search. Each name is sent only where the model declares it, in
the declared type.

Beam search takes up to the model's `max_beam_width` parameter beams (TensorRT-LLM's default, 1, is none).

`end_id` is always sent unless the request ignores the end id: TensorRT-LLM's default is -1, "no end id",
so a model called without it never stops at EOS. `runtime_top_p` must be in (0, 1]: greedy decoding is
`runtime_top_k` 1 and no `runtime_top_p`.

Outputs: with `streaming` each response carries only the new tokens, prompt never included:
`output_ids` [1, beams, n] (shorter beams padded with -1) with `sequence_length` [1, beams] = n, and
`output_log_probs` for them. Where the model declares `return_perf_metrics` and `kv_cache_reused_blocks`
(TensorRT-LLM 0.16+), every request asks for its performance metrics, and the blocks of the prompt's KV
cache reused from earlier requests, times the engine's tokens per block (`llm[].tokens_per_block`), are
the prompt's cached tokens. With beam search TensorRT-LLM returns every beam's generated tokens so far
in each response instead (LlmRequest sets returnAllGeneratedTokens when streaming with beams: beam search
may rewrite earlier tokens), and `sequence_length` is each beam's length.

A LoRA adapter adds `lora_task_id`, with `lora_weights` and `lora_config` the first time
(services/llm/lora.py; the ensemble and BLS model take the same).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import numpy as np

from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from services.llm.backends import GuideKind, Knob, Sampling, Step
from services.llm.logits import (
    LOGIT_KNOBS,
    add_alternatives,
    first_prompt_logprobs,
    has_logits,
    logit_flags,
    logit_outputs,
)
from services.llm.lora import TaskCache, has_lora_inputs
from services.llm.tensors import ModelInterface, beam_tokens, encode_words, int_value, max_beam_width, refuse

REQUIRED_INPUTS = ("input_ids", "input_lengths", "request_output_len", "streaming")
REQUIRED_OUTPUTS = ("output_ids", "sequence_length")
SEED = ("seed", "random_seed")  # the input's name since 2025-05, and before
MIN_TOKENS = ("min_tokens", "min_length")
_KNOB_INPUTS: dict[Knob, tuple[str, ...]] = {
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "bad_words": ("bad_words_list",),
    "logit_bias": ("bad_words_list",),
    "stop_words": ("stop_words_list",),
    "seed": SEED,
    "top_k": ("runtime_top_k",),
    "repetition_penalty": ("repetition_penalty",),
    "min_tokens": MIN_TOKENS,
}
# Done by the service (special tokens: its detokenizer) or by leaving `end_id` out (ignore_eos); TensorRT-LLM's
# Triton interface has no min_p.
_OTHER_KNOBS: dict[Knob, bool] = {"special_tokens": True, "ignore_eos": True, "min_p": False, "images": False}

# Guided decoding (TensorRT-LLM 0.17+, with `guided_decoding_backend` xgrammar in the model's parameters): the
# guide's type (json, json_schema, regex, ebnf_grammar) and the guide itself.
GUIDE_INPUTS = ("guided_decoding_guide_type", "guided_decoding_guide")
GUIDE_TYPES: dict[GuideKind, str] = {"json_schema": "json_schema", "grammar": "ebnf_grammar", "regex": "regex"}
# KV cache reuse (TensorRT-LLM 0.16+): with `return_perf_metrics` each response reports the blocks of the
# prompt's KV cache taken from earlier requests.
REUSE_INPUT, REUSE_OUTPUT = "return_perf_metrics", "kv_cache_reused_blocks"


def guide_values(sampling: Sampling) -> dict[str, Any]:
    """The guided-decoding inputs of both TensorRT-LLM interfaces (None: not sent)."""
    guide = sampling.guide
    return {} if guide is None else {"guided_decoding_guide_type": GUIDE_TYPES[guide.kind],
                                     "guided_decoding_guide": guide.text}


def reports_reuse(interface: ModelInterface) -> bool:
    """Whether the model reports the KV cache blocks it reused (both TensorRT-LLM interfaces)."""
    return interface.has(REUSE_INPUT) and REUSE_OUTPUT in interface.outputs


def cached_tokens(result: Mapping[str, np.ndarray], tokens_per_block: int) -> int | None:
    """The prompt tokens a response says the backend took from its KV cache: reused blocks times the tokens
    of a block (None: it does not say)."""
    blocks = int_value(result.get(REUSE_OUTPUT))
    return None if blocks is None else blocks * tokens_per_block


class TensorRTLLM:
    """The `tensorrt_llm` tensor interface on one Triton model."""

    name = "tensorrt_llm"
    takes_text = False

    def __init__(self, triton: Triton, pool: TritonPool, model: str,
                 constants: Mapping[str, float] | None = None, tokens_per_block: int = 64) -> None:
        self.triton = triton
        self.pool = pool
        self.model = model
        self.constants = dict(constants or {})
        self.tokens_per_block = tokens_per_block  # of the engine's KV cache, for the blocks it reports reusing
        self.interface = ModelInterface({})
        self.lora = TaskCache()
        self.beam_widths: list[int] = []

    def configure(self, triton_config: dict[str, Any]) -> None:
        interface = ModelInterface(triton_config)
        missing = interface.missing(REQUIRED_INPUTS, REQUIRED_OUTPUTS)
        if missing:
            raise refuse(self.model, f"lacks the TensorRT-LLM tensors {', '.join(missing)} (check `backend` "
                         "in the model config)")
        if not interface.decoupled:
            raise refuse(self.model, "must be decoupled to stream (model_transaction_policy { decoupled: true })")
        interface.check_constants(self.model, self.constants)
        self.interface = interface
        limit = max_beam_width(triton_config) or 1
        self.beam_widths = list(range(2, limit + 1)) if interface.has("beam_width") else []

    def supports(self, knob: Knob) -> bool:
        if knob in _OTHER_KNOBS:
            return _OTHER_KNOBS[knob]
        if knob in LOGIT_KNOBS:
            return has_logits(self.interface.inputs, self.interface.outputs, knob)
        if knob == "logprobs":
            return self.interface.has("return_log_probs") and "output_log_probs" in self.interface.outputs
        if knob == "guided_decoding":
            return not self.interface.missing(GUIDE_INPUTS)
        if knob == "lora":
            return has_lora_inputs(self.interface)
        return self.interface.first(*_KNOB_INPUTS[knob]) is not None

    def tensors(self, prompt: Sequence[int], sampling: Sampling) -> dict[str, np.ndarray]:
        """The request's input tensors (only those the model declares)."""
        model = self.interface
        values: dict[str, Any] = {
            **self.constants,
            "input_lengths": len(prompt),
            "request_output_len": sampling.max_new_tokens,
            "streaming": True,
            "exclude_input_in_output": True,
            **sampling_values(model, sampling, "runtime_top_k", "runtime_top_p"),
            "return_log_probs": True if sampling.logprobs else None,
            "end_id": None if sampling.ignore_eos else sampling.end_id,
            "beam_width": sampling.beam_width if sampling.beam_width > 1 else None,
            **guide_values(sampling),
            REUSE_INPUT: True if reports_reuse(model) else None,
            **logit_flags(sampling),
        }
        tensors = {"input_ids": model.tensor("input_ids", list(prompt)), **model.scalars(values)}
        for name, words in (("stop_words_list", sampling.stop_words), ("bad_words_list", sampling.bad_words)):
            if any(words) and model.has(name):
                array = encode_words(words).astype(model.dtype(name), copy=False)
                tensors[name] = array if model.batched else array[0]
        return tensors

    async def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
                     ) -> AsyncGenerator[Step, None]:
        outputs = list(REQUIRED_OUTPUTS)
        if sampling.logprobs:
            outputs.append("output_log_probs")
        if reports_reuse(self.interface):
            outputs.append(REUSE_OUTPUT)
        outputs += logit_outputs(sampling)
        done = 0  # tokens received so far
        prompt_pending = sampling.prompt_logprobs  # the first response brings them
        tensors = self.tensors(prompt, sampling)
        async for result in self.lora.stream(sampling.adapter, self.interface, lambda lora: self.triton.stream(
                self.pool, self.model, {**tensors, **lora}, outputs, timeout, sampling.request_id,
                self.interface.triton_priority(sampling.priority))):
            if "output_ids" not in result or "sequence_length" not in result:
                continue  # an empty final response (a stop request, a cancellation)
            cached = cached_tokens(result, self.tokens_per_block)
            if sampling.beam_width > 1:
                yield Step(beams=beam_tokens(result["output_ids"], result["sequence_length"]), cached_tokens=cached)
                continue
            length = int(result["sequence_length"].reshape(-1)[0])  # [1, beams]: beam 0
            ids = result["output_ids"].reshape(-1, result["output_ids"].shape[-1])[0][:length] if length > 0 else []
            step = Step([int(token) for token in ids], cached_tokens=cached)
            if prompt_pending:
                step.prompt_logprobs = first_prompt_logprobs(result, prompt, sampling.top_logprobs, self.model)
                prompt_pending = False
            if length <= 0:
                if cached is not None or step.prompt_logprobs is not None:
                    yield step
                continue
            if "output_log_probs" in result:
                step.logprobs = _new_logprobs(result["output_log_probs"], done, length)
            add_alternatives(step, result, sampling)
            done += length
            yield step


def sampling_values(model: ModelInterface, sampling: Sampling, top_k: str, top_p: str) -> dict[str, Any]:
    """TensorRT-LLM's sampling scalars, by the names the model uses (the `tensorrt_llm` model's or the
    ensemble's, either version's); None leaves TensorRT-LLM's default. Greedy is top-k 1: TensorRT-LLM
    wants top-p in (0, 1]."""
    values: dict[str, Any] = {
        top_k: 1 if sampling.greedy else sampling.top_k or None,
        top_p: None if sampling.greedy else sampling.top_p,
        "temperature": None if sampling.greedy else sampling.temperature,
        "repetition_penalty": sampling.repetition_penalty if sampling.repetition_penalty != 1.0 else None,
        "presence_penalty": sampling.presence_penalty or None,
        "frequency_penalty": sampling.frequency_penalty or None,
    }
    seed, min_tokens = model.first(*SEED), model.first(*MIN_TOKENS)
    if seed:
        values[seed] = sampling.seed
    if min_tokens and sampling.min_tokens:
        values[min_tokens] = sampling.min_tokens
    return values


def _new_logprobs(array: np.ndarray, done: int, length: int) -> list[float] | None:
    """The new tokens' log probabilities: the whole row when it holds only theirs, else their positions
    in a row that counts from the first generated token."""
    row = array.reshape(-1, array.shape[-1])[0] if array.size else array.reshape(-1)
    if row.size == length:
        return [float(value) for value in row]
    if row.size >= done + length:
        return [float(value) for value in row[done: done + length]]
    return None
