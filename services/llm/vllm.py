"""The vLLM adapter: Triton's vllm_backend (decoupled, no batch dimension), text in and text out.

Inputs: `text_input` (the prompt as text), `image` (the chat's images, base64 image files, where the model
declares it: vllm_backend's multimodal input), `stream` true, `exclude_input_in_output` true, `sampling_parameters`
(vLLM `SamplingParams` as JSON: `max_tokens`, `temperature`, `top_p`, `top_k`, `min_p`, `seed`, `stop`,
`include_stop_str_in_output`, penalties, `min_tokens`, `ignore_eos`, `logprobs`, `skip_special_tokens`,
`lora_name`, `structured_outputs` for guided decoding: `json`, `grammar` or `regex`) and `return_finish_reason`,
`return_num_input_tokens`, `return_num_output_tokens`, `return_logprobs` where declared. Only keys that differ
from vLLM's defaults are sent: the backend builds `SamplingParams(**json)`, and a key its vLLM does not know
fails the request (`TritonSamplingParams.from_dict` logs the error and returns nothing, and the request ends
with an error response). `structured_outputs` is the name since vLLM 0.11 (before: `guided_decoding`).

Outputs: `text_output`, the new text of each response (vLLM detokenizes incrementally and holds back what
may begin a stop string); `finish_reason` ("None" until the last response, then "stop" or "length";
"abort" is an error); `num_input_tokens`; `num_output_tokens` (tokens in this response); `logprobs`, JSON
`[{token_id: {logprob, rank, decoded_token}}]` for this response's positions, the sampled token first.
Backends before r24.03 (no `exclude_input_in_output` input) stream the prompt plus the whole text so far.

The prompt's log probabilities (`echo` with `logprobs`): the vllm_backend passes none back. A model that
declares the input `return_prompt_logprobs` and the output `prompt_logprobs` (as the demo vLLM model does)
gets `prompt_logprobs` k in `sampling_parameters` and answers with vLLM's PromptLogprobs as JSON in its
first response: null for the first position, then `{token_id: {logprob, rank, decoded_token}}` per
position, the prompt's token first.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np

from services.common.errors import ServiceError
from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from services.llm.backends import FinishReason, GuideKind, Knob, PromptLogprob, Sampling, Step
from services.llm.tensors import CumulativeText, ModelInterface, int_value, refuse, text_value

REQUIRED_INPUTS = ("text_input", "sampling_parameters")
# Knobs that need a backend flag; vLLM's SamplingParams has all the others, except bans of token ids and
# word lists (`logit_bias` and `bad_words` exist only in newer vLLM, and an unknown key fails the request).
_FLAG_KNOBS: dict[Knob, tuple[str, str]] = {"logprobs": ("return_logprobs", "logprobs"),
                                            "top_logprobs": ("return_logprobs", "logprobs"),
                                            "prompt_logprobs": ("return_prompt_logprobs", "prompt_logprobs")}
_UNSUPPORTED: set[Knob] = {"bad_words", "logit_bias"}
# StructuredOutputsParams' field for each kind of guide.
STRUCTURED_OUTPUTS: dict[GuideKind, str] = {"json_schema": "json", "grammar": "grammar", "regex": "regex"}
_FLAGS = {"return_finish_reason": "finish_reason", "return_num_input_tokens": "num_input_tokens",
          "return_num_output_tokens": "num_output_tokens"}


def sampling_parameters(sampling: Sampling, lora_name: str | None = None) -> dict[str, Any]:
    """`Sampling` as vLLM SamplingParams fields, leaving out what is at vLLM's default."""
    params: dict[str, Any] = {"max_tokens": sampling.max_new_tokens, "seed": sampling.seed}
    if sampling.greedy:
        params["temperature"] = 0.0
    else:
        params.update(temperature=sampling.temperature, top_p=sampling.top_p)
        if sampling.top_k:
            params["top_k"] = sampling.top_k
        if sampling.min_p:
            params["min_p"] = sampling.min_p
    optional: dict[str, tuple[Any, Any]] = {  # SamplingParams field: (value, vLLM's default)
        "stop": ([stop for stop in sampling.stop if stop], []),
        "include_stop_str_in_output": (sampling.include_stop_str, False),
        "presence_penalty": (sampling.presence_penalty, 0.0),
        "frequency_penalty": (sampling.frequency_penalty, 0.0),
        "repetition_penalty": (sampling.repetition_penalty, 1.0),
        "min_tokens": (sampling.min_tokens, 0),
        "ignore_eos": (sampling.ignore_eos, False),
        "skip_special_tokens": (sampling.skip_special_tokens, True),
        "lora_name": (lora_name, None),
    }
    params.update({key: value for key, (value, default) in optional.items() if value != default})
    if sampling.logprobs:
        params["logprobs"] = sampling.top_logprobs  # alternatives; 0: the sampled token's only
    if sampling.prompt_logprobs:
        params["prompt_logprobs"] = sampling.top_logprobs
    guide = sampling.guide
    if guide is not None:  # vLLM 0.11+ StructuredOutputsParams, which the backend reads from a JSON string
        value = guide.text if guide.kind == "json_schema" else json.dumps(guide.text)  # a schema is JSON already
        params["structured_outputs"] = f'{{"{STRUCTURED_OUTPUTS[guide.kind]}": {value}}}'
    return params


def _position(position: Mapping[str, Any], alternatives: int) -> tuple[int, float, list[tuple[int, float]]] | None:
    """One position's dict → its first token (vLLM puts the sampled, or the prompt's, token first), that token's
    log probability and the `alternatives` most likely tokens (by rank); None when empty."""
    entries = [(int(token), float(entry["logprob"]), int(entry.get("rank") or 0)) for token, entry in position.items()]
    if not entries:
        return None
    ranked = sorted({token: (token, logprob, rank) for token, logprob, rank in entries}.values(),
                    key=lambda entry: (entry[2] or 10**9, -entry[1]))
    return entries[0][0], entries[0][1], [(token, logprob) for token, logprob, _ in ranked[:alternatives]]


def parse_logprobs(raw: str, alternatives: int) -> tuple[list[int], list[float], list[list[tuple[int, float]]]]:
    """vLLM's per-position dicts → the sampled tokens, their log probabilities, and the `alternatives` most
    likely tokens at each position (by rank)."""
    tokens, values, tops = [], [], []
    for position in json.loads(raw) or []:
        parsed = _position(position, alternatives)
        if parsed is not None:
            tokens.append(parsed[0])
            values.append(parsed[1])
            tops.append(parsed[2])
    return tokens, values, tops


def parse_prompt_logprobs(raw: str, prompt: Sequence[int], alternatives: int, model: str) -> list[PromptLogprob]:
    """vLLM's PromptLogprobs (null first, then a dict per position, the prompt's token first) → one entry per
    prompt token; the first token's id is the service's (nothing names it)."""
    positions = json.loads(raw) if raw else None
    if not isinstance(positions, list) or not positions:
        raise ServiceError(grpc.StatusCode.INTERNAL, f"Triton model `{model}` returned no prompt_logprobs although "
                           "the request asked for them")
    result = [PromptLogprob(int(prompt[0]) if prompt else -1, None)]
    for position in positions[1:]:
        parsed = _position(position or {}, alternatives)
        if parsed is not None:
            result.append(PromptLogprob(*parsed))
    return result


def _finish_reason(value: str, model: str) -> FinishReason | None:
    if value == "length":
        return "length"
    if value == "abort":
        raise ServiceError(grpc.StatusCode.INTERNAL, f"vLLM aborted the generation on Triton model `{model}`")
    return "stop" if value not in ("", "None") else None


class Vllm:
    """The vLLM tensor interface on one Triton model."""

    name = "vllm"
    takes_text = True
    beam_widths = ()  # vLLM's SamplingParams has had no beam search since 0.6.3 (it moved to a separate API)

    def __init__(self, triton: Triton, pool: TritonPool, model: str, constants: Mapping[str, float] | None = None,
                 lora_name: str | None = None) -> None:
        self.triton = triton
        self.pool = pool
        self.model = model
        self.constants = dict(constants or {})
        self.lora_name = lora_name
        self.interface = ModelInterface({})

    def configure(self, triton_config: dict[str, Any]) -> None:
        interface = ModelInterface(triton_config)
        missing = interface.missing(REQUIRED_INPUTS, ("text_output",))
        if missing:
            raise refuse(self.model, f"lacks the vLLM tensors {', '.join(missing)} (check `backend` in the "
                         "model config)")
        interface.check_constants(self.model, self.constants)
        self.interface = interface

    @property
    def cumulative(self) -> bool:
        """Backends before r24.03 stream the prompt and the whole text so far (and have no such input)."""
        return not self.interface.has("exclude_input_in_output")

    def supports(self, knob: Knob) -> bool:
        if knob in _FLAG_KNOBS:
            flag, output = _FLAG_KNOBS[knob]
            return self.interface.has(flag) and output in self.interface.outputs
        if knob == "images":
            return self.interface.has("image")
        return knob not in _UNSUPPORTED

    def tensors(self, text: str, sampling: Sampling) -> dict[str, np.ndarray]:
        """The request's input tensors (only those the model declares)."""
        params = sampling_parameters(sampling, sampling.adapter.lora_name if sampling.adapter else self.lora_name)
        flags = {flag: True for flag, output in _FLAGS.items() if output in self.interface.outputs}
        tensors = self.interface.scalars({
            **self.constants, "text_input": text, "stream": True, "exclude_input_in_output": True,
            "sampling_parameters": json.dumps(params), **flags,
            "return_logprobs": True if sampling.logprobs else None,
            "return_prompt_logprobs": True if sampling.prompt_logprobs else None,
        })
        if sampling.images:
            tensors["image"] = self.interface.tensor("image", [base64.b64encode(image).decode("ascii")
                                                               for image in sampling.images])
        return tensors

    def outputs(self, sampling: Sampling) -> list[str]:
        wanted = ["text_output", *_FLAGS.values(), *(["logprobs"] if sampling.logprobs else []),
                  *(["prompt_logprobs"] if sampling.prompt_logprobs else [])]
        return [name for name in wanted if name in self.interface.outputs]

    async def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
                     ) -> AsyncGenerator[Step, None]:
        cumulative = CumulativeText(skip=len(text)) if self.cumulative else None
        prompt_pending = sampling.prompt_logprobs  # the first response brings them
        async for result in self.triton.stream(self.pool, self.model, self.tensors(text, sampling),
                                               self.outputs(sampling), timeout, sampling.request_id,
                                               self.interface.triton_priority(sampling.priority)):
            if "text_output" not in result:
                continue
            piece = text_value(result["text_output"])
            step = Step(text=cumulative.delta(piece) if cumulative else piece,
                        tokens=int_value(result.get("num_output_tokens")),
                        prompt_tokens=int_value(result.get("num_input_tokens")))
            if "finish_reason" in result:
                step.finish_reason = _finish_reason(text_value(result["finish_reason"]), self.model)
            if "logprobs" in result:
                step.token_ids, step.logprobs, step.top_logprobs = parse_logprobs(
                    text_value(result["logprobs"]), sampling.top_logprobs)
            if prompt_pending:
                raw = text_value(result["prompt_logprobs"]) if "prompt_logprobs" in result else ""
                step.prompt_logprobs = parse_prompt_logprobs(raw, prompt, sampling.top_logprobs, self.model)
                prompt_pending = False
            yield step
        if cumulative is not None and (rest := cumulative.rest()):
            yield Step(text=rest, tokens=0)
