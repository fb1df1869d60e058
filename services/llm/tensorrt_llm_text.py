"""The TensorRT-LLM text adapter: the `ensemble` and `tensorrt_llm_bls` models of Triton's tensorrtllm_backend,
which tokenize the prompt themselves (their `preprocessing` model) and stream text.

Inputs: `text_input` (the prompt as text: the service's rendered chat template, or the prompt) and
`max_tokens` (INT32), `stream` true, `exclude_input_in_output` true where declared, `end_id` (-1 when the
request ignores the end id: the preprocessing model passes it on, and TensorRT-LLM reads -1 as "none"),
sampling scalars by their ensemble names (`top_k`, `top_p`, `temperature`, `repetition_penalty`,
`presence_penalty`, `frequency_penalty`, `min_tokens` or before 2025-05 `min_length`, `seed` or before
2025-05 `random_seed`), `stop_words` / `bad_words` one string per word (left out when empty), and
`return_num_input_tokens` / `return_num_output_tokens` where declared; a LoRA adapter's inputs as the
`tensorrt_llm` model's (services/llm/lora.py).

Outputs: `text_output`, a delta per streamed response (each response's tokens decoded on their own), or
the whole text so far when the BLS model accumulates tokens (its `accumulate_tokens` parameter, or
`accumulate_tokens` in tritongate's model config); `num_input_tokens` / `num_output_tokens` (tokens in
this response) where the model has them, else the service counts tokens with the model's tokenizer;
`kv_cache_reused_blocks` with `return_perf_metrics`, where declared, as the `tensorrt_llm` model's.
The stop words' tokens stay in the output (TensorRT-LLM's stop criterion only ends the sequence): the
service cuts the stop strings from the text.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import numpy as np

from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from services.llm.backends import Knob, Sampling, Step
from services.llm.lora import TaskCache, has_lora_inputs
from services.llm.tensorrt_llm import (
    GUIDE_INPUTS,
    MIN_TOKENS,
    REUSE_INPUT,
    REUSE_OUTPUT,
    SEED,
    cached_tokens,
    guide_values,
    reports_reuse,
    sampling_values,
)
from services.llm.tensors import CumulativeText, ModelInterface, int_value, refuse, text_value

REQUIRED_INPUTS = ("text_input", "max_tokens")
_KNOB_INPUTS: dict[Knob, tuple[str, ...]] = {
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "bad_words": ("bad_words",),
    "stop_words": ("stop_words",),
    "seed": SEED,
    "top_k": ("top_k",),
    "repetition_penalty": ("repetition_penalty",),
    "min_tokens": MIN_TOKENS,
    "ignore_eos": ("end_id",),
}
# Without token ids the service cannot tie log probabilities to tokens, nor ban single token ids; special
# tokens are the postprocessing model's setting (`skip_special_tokens`), not a request's. Images: the
# multimodal ensemble's inputs (`image_url_input`, `image_bytes_input`: decoded pixels) are not driven yet.
_UNSUPPORTED: set[Knob] = {"logprobs", "top_logprobs", "logit_bias", "min_p", "special_tokens", "images"}
_TRUE = ("true", "yes", "1", "t")  # as tensorrt_llm_bls reads its `accumulate_tokens` parameter


class TensorRTLLMText:
    """The ensemble / BLS text interface on one Triton model."""

    name = "tensorrt_llm_text"
    takes_text = True
    beam_widths = ()  # not offered: tritongate reads one `text_output` per response, not one per beam

    def __init__(self, triton: Triton, pool: TritonPool, model: str, constants: Mapping[str, float] | None = None,
                 accumulate_tokens: bool | None = None, tokens_per_block: int = 64) -> None:
        self.triton = triton
        self.pool = pool
        self.model = model
        self.constants = dict(constants or {})
        self.tokens_per_block = tokens_per_block  # of the engine's KV cache, for the blocks it reports reusing
        self.configured_accumulate = accumulate_tokens  # the model config file's say; None: the Triton model's
        self.accumulate = bool(accumulate_tokens)
        self.interface = ModelInterface({})
        self.lora = TaskCache()

    def configure(self, triton_config: dict[str, Any]) -> None:
        interface = ModelInterface(triton_config)
        missing = interface.missing(REQUIRED_INPUTS, ("text_output",))
        if missing:
            raise refuse(self.model, f"lacks the TensorRT-LLM ensemble/BLS tensors {', '.join(missing)} (check "
                         "`backend` in the model config)")
        ensemble = triton_config.get("platform") == "ensemble"
        if not ensemble and not interface.decoupled:
            raise refuse(self.model, "must be decoupled to stream (model_transaction_policy { decoupled: true })")
        interface.check_constants(self.model, self.constants)
        self.interface = interface
        if self.configured_accumulate is not None:
            self.accumulate = self.configured_accumulate
        else:
            self.accumulate = interface.parameters.get("accumulate_tokens", "").lower() in _TRUE

    def supports(self, knob: Knob) -> bool:
        if knob == "guided_decoding":
            return not self.interface.missing(GUIDE_INPUTS)
        if knob == "lora":
            return has_lora_inputs(self.interface)
        return knob not in _UNSUPPORTED and self.interface.first(*_KNOB_INPUTS[knob]) is not None

    def tensors(self, text: str, sampling: Sampling) -> dict[str, np.ndarray]:
        """The request's input tensors (only those the model declares)."""
        model = self.interface
        values: dict[str, Any] = {
            **self.constants,
            "text_input": text,
            "max_tokens": sampling.max_new_tokens,
            "stream": True,
            "exclude_input_in_output": True,
            "end_id": -1 if sampling.ignore_eos else sampling.end_id,
            **sampling_values(model, sampling, "top_k", "top_p"),
            "return_num_input_tokens": True,
            "return_num_output_tokens": True,
            **guide_values(sampling),
            REUSE_INPUT: True if reports_reuse(model) else None,
        }
        tensors = model.scalars(values)
        # With min_tokens the service, not TensorRT-LLM, ends completions on stop strings: TensorRT-LLM's stop
        # words would end them before min_tokens.
        stops = [] if sampling.min_tokens else sampling.stop
        for name, words in (("stop_words", stops), ("bad_words", sampling.bad)):
            words = [word for word in words if word]
            if words and model.has(name):
                tensors[name] = model.tensor(name, words)
        return tensors

    def outputs(self) -> list[str]:
        counts = [name for name in ("num_input_tokens", "num_output_tokens") if name in self.interface.outputs]
        return ["text_output", *counts, *([REUSE_OUTPUT] if reports_reuse(self.interface) else [])]

    async def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
                     ) -> AsyncGenerator[Step, None]:
        cumulative = CumulativeText() if self.accumulate else None
        tensors = self.tensors(text, sampling)
        async for result in self.lora.stream(sampling.adapter, self.interface, lambda lora: self.triton.stream(
                self.pool, self.model, {**tensors, **lora}, self.outputs(), timeout, sampling.request_id,
                self.interface.triton_priority(sampling.priority))):
            if "text_output" not in result:
                continue  # an empty final response
            piece = text_value(result["text_output"])
            if cumulative is not None:
                piece = cumulative.delta(piece)
            yield Step(text=piece, tokens=int_value(result.get("num_output_tokens")),
                       prompt_tokens=int_value(result.get("num_input_tokens")),
                       cached_tokens=cached_tokens(result, self.tokens_per_block))
        if cumulative is not None and (rest := cumulative.rest()):
            yield Step(text=rest, tokens=0)
