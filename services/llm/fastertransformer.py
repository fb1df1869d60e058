"""The FasterTransformer adapter: Triton's fastertransformer_backend tensor interface, decoupled.

Inputs: `input_ids` [1, len], `input_lengths` and `request_output_len` [1, 1] (UINT32), optional
sampling scalars [1, 1] (`runtime_top_k`, `runtime_top_p`, `temperature`, `repetition_penalty`,
`presence_penalty`, `random_seed`, `start_id`, `end_id`, `is_return_log_probs`, and `min_length` where a
deployment adds it to its config.pbtxt: FT's GPT reads it, unconfirmed through Triton) and word lists
`stop_words_list` / `bad_words_list` [1, 2, N] (INT32), `beam_width` for beam search. Only inputs the
Triton model declares are sent, with the data types it declares.

Beam search: FT takes a `beam_width` of 1, 2, 3, 4, 8, 16 or 32 (any other falls back to 1, with only a
warning in its log), so only those are offered, up to the Triton model's `max_beam_width` parameter where
its configuration sets one (FT's own configurations have none).

Outputs: every streamed response carries the whole sequence so far, prompt included, in `output_ids`
[1, beam, width] (positions past `sequence_length` are padding) and `output_log_probs`
[1, beam, request_output_len]; the adapter turns them into the tokens that are new (with beam search:
every beam's generated tokens, best first, in every step).

Not FT's own: a model that also declares TensorRT-LLM's `return_context_logits` / `context_logits` and
`return_generation_logits` / `generation_logits` (as the demo FT model does) gives the prompt's log
probabilities and alternatives per token (services/llm/logits.py): `context_logits` [1, prompt length,
vocab] in the first response that brings a token, `generation_logits` [1, 1, new, vocab] of the tokens
new in each response. Without them `echo` with `logprobs`, and alternatives, are refused.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.utils import triton_to_np_dtype

from services.common.errors import ServiceError
from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from services.llm.backends import Knob, Sampling, Step
from services.llm.logits import (
    LOGIT_KNOBS,
    add_alternatives,
    first_prompt_logprobs,
    has_logits,
    logit_flags,
    logit_outputs,
)
from services.llm.tensors import ModelInterface, beam_tokens, encode_words, max_beam_width, triton_priority

__all__ = ["FasterTransformer", "encode_words"]

REQUIRED_INPUTS = ("input_ids", "input_lengths", "request_output_len")
_KNOB_INPUTS: dict[Knob, str] = {
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "logprobs": "is_return_log_probs",
    "bad_words": "bad_words_list",
    "stop_words": "stop_words_list",
    "seed": "random_seed",
    "top_k": "runtime_top_k",
    "repetition_penalty": "repetition_penalty",
    "logit_bias": "bad_words_list",
    "min_tokens": "min_length",
}
# What the service does itself for a token-level backend (special tokens: its detokenizer), and what FT
# cannot do: it falls back to the end id of its config.ini when none is sent, so `ignore_eos` is refused;
# it has no guided decoding, so a JSON format or a forced tool call cannot be enforced.
_SERVICE_KNOBS: dict[Knob, bool] = {"special_tokens": True, "ignore_eos": False, "min_p": False,
                                    "guided_decoding": False, "lora": False, "images": False}
FT_BEAM_WIDTHS = (2, 3, 4, 8, 16, 32)  # ParallelGptTritonModelInstance.cc: any other width runs as 1


class FasterTransformer:
    """The FT tensor interface on one Triton model."""

    name = "fastertransformer"
    takes_text = False

    def __init__(self, triton: Triton, pool: TritonPool, model: str,
                 constants: dict[str, float] | None = None) -> None:
        self.triton = triton
        self.pool = pool
        self.model = model
        self.constants = dict(constants or {})
        self.inputs: dict[str, Any] = {}  # declared input → numpy dtype
        self.outputs: set[str] = set()
        self.beam_widths: list[int] = []
        self.priority_levels = 0  # the model's scheduler levels (dynamic_batching.priority_levels)

    def configure(self, triton_config: dict[str, Any]) -> None:
        inputs = {tensor["name"]: triton_to_np_dtype(str(tensor["data_type"]).removeprefix("TYPE_"))
                  for tensor in triton_config.get("input", [])}
        outputs = {tensor["name"] for tensor in triton_config.get("output", [])}
        missing = [name for name in REQUIRED_INPUTS if name not in inputs]
        missing += [name for name in ("output_ids", "sequence_length") if name not in outputs]
        missing += [name for name in self.constants if name not in inputs]
        if missing:
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"Triton model `{self.model}` lacks the FasterTransformer tensors "
                               f"{', '.join(missing)} (check `backend` and `triton_inputs` in the model config)")
        self.inputs, self.outputs = inputs, outputs
        self.priority_levels = ModelInterface(triton_config).priority_levels
        limit = max_beam_width(triton_config)
        self.beam_widths = [width for width in FT_BEAM_WIDTHS if "beam_width" in inputs and width <= (limit or width)]

    def supports(self, knob: Knob) -> bool:
        if knob in _SERVICE_KNOBS:
            return _SERVICE_KNOBS[knob]
        if knob in LOGIT_KNOBS:
            return has_logits(self.inputs, self.outputs, knob)
        if knob == "logprobs":
            return "is_return_log_probs" in self.inputs and "output_log_probs" in self.outputs
        return _KNOB_INPUTS[knob] in self.inputs

    def tensors(self, prompt: Sequence[int], sampling: Sampling) -> dict[str, np.ndarray]:
        """The request's input tensors (only those the model declares)."""
        values: dict[str, Any] = {
            **self.constants,  # inputs tritongate does not set itself
            "runtime_top_k": 1 if sampling.greedy else sampling.top_k,
            "runtime_top_p": 0.0 if sampling.greedy else sampling.top_p,
            "temperature": 1.0 if sampling.greedy else sampling.temperature,
            "repetition_penalty": sampling.repetition_penalty,
            "random_seed": sampling.seed,
        }
        if sampling.presence_penalty:
            values["presence_penalty"] = sampling.presence_penalty
        if sampling.frequency_penalty:
            values["frequency_penalty"] = sampling.frequency_penalty
        if sampling.logprobs:
            values["is_return_log_probs"] = True
        if sampling.min_tokens:
            values["min_length"] = sampling.min_tokens
        if sampling.end_id is not None:
            values["end_id"] = sampling.end_id
        if sampling.start_id is not None:
            values["start_id"] = sampling.start_id
        if sampling.beam_width > 1:
            values["beam_width"] = sampling.beam_width
        values.update({name: flag for name, flag in logit_flags(sampling).items() if flag is not None})
        tensors = {
            "input_ids": np.array([list(prompt)], dtype=self.inputs["input_ids"]),
            "input_lengths": np.array([[len(prompt)]], dtype=self.inputs["input_lengths"]),
            "request_output_len": np.array([[sampling.max_new_tokens]], dtype=self.inputs["request_output_len"]),
        }
        for name, value in values.items():
            if name in self.inputs:
                tensors[name] = np.array([[value]], dtype=self.inputs[name])
        for name, words in (("stop_words_list", sampling.stop_words), ("bad_words_list", sampling.bad_words)):
            if words and name in self.inputs:
                tensors[name] = encode_words(words).astype(self.inputs[name], copy=False)
        return tensors

    async def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
                     ) -> AsyncGenerator[Step, None]:
        outputs = ["output_ids", "sequence_length"]
        if sampling.logprobs:
            outputs.append("output_log_probs")
        outputs += logit_outputs(sampling)
        prompt_pending = sampling.prompt_logprobs  # the first response with a token brings them
        done = len(prompt)  # valid positions already seen
        async for result in self.triton.stream(self.pool, self.model, self.tensors(prompt, sampling), outputs,
                                               timeout, sampling.request_id,
                                               triton_priority(self.priority_levels, sampling.priority)):
            if "output_ids" not in result or "sequence_length" not in result:
                continue  # the empty final response of a cancelled request
            if sampling.beam_width > 1:
                yield Step(beams=beam_tokens(result["output_ids"], result["sequence_length"], len(prompt)))
                continue
            length = int(result["sequence_length"].reshape(-1)[0])  # [batch, beam]: beam 0
            if length <= done:
                continue
            ids = result["output_ids"].reshape(-1, result["output_ids"].shape[-1])[0]
            step = Step(ids[done:length].tolist())
            if prompt_pending:
                step.prompt_logprobs = first_prompt_logprobs(result, prompt, sampling.top_logprobs, self.model)
                prompt_pending = False
            if "output_log_probs" in result:
                per_token = result["output_log_probs"].reshape(-1, result["output_log_probs"].shape[-1])[0]
                step.logprobs = per_token[done - len(prompt): length - len(prompt)].astype(float).tolist()
            add_alternatives(step, result, sampling)
            done = length
            yield step
