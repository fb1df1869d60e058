"""OpenAI request parameters → backend-neutral `Sampling`: the seed's `model_infos` defaults where the
request says nothing, validation that names the parameter, and refusals for knobs the backend lacks
(a default value is never refused)."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc

from services.common.errors import ServiceError, invalid_argument
from services.llm.backends import Knob, LlmBackend, Sampling
from services.llm.fastertransformer import seed_words
from tritongate.config import ModelInfo
from tritongate.llm.v1 import llm_pb2

MAX_N = 16  # default of the model configuration's `max_n`
MAX_STOPS = 4
DEFAULT_CONTEXT = 2048
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def context_length(info: ModelInfo, tokenizer: Any, path: str) -> int:
    """`max_len` from model_infos, else the model folder's config.json, else the tokenizer's limit."""
    if info.max_len:
        return info.max_len
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        config = {}
    for key in _CONTEXT_KEYS:
        if isinstance(config.get(key), int) and config[key] > 0:
            return int(config[key])
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else DEFAULT_CONTEXT


@dataclass
class Defaults:
    """One model's generation defaults."""

    max_len: int
    end_id: int | None
    start_id: int | None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    stop_words: list[list[int]] | None = None
    bad_words: list[list[int]] | None = None

    @classmethod
    def of(cls, info: ModelInfo, tokenizer: Any, path: str) -> Defaults:
        """Negative ids (the seed writes e.g. `"end_id": -2`) mean: the tokenizer's."""
        end_id = info.end_id if info.end_id is not None and info.end_id >= 0 else tokenizer.eos_token_id
        start_id = info.start_id if info.start_id is not None and info.start_id >= 0 else None
        return cls(context_length(info, tokenizer, path), end_id, start_id, info.temperature, info.top_k,
                   info.top_p, info.repetition_penalty, seed_words(info.stop_words), seed_words(info.bad_words))


def _finite(value: float, low: float, high: float, param: str) -> float:
    if not (math.isfinite(value) and low <= value <= high):
        raise invalid_argument(f"`{param}` must be between {low:g} and {high:g}; got {value:g}.", param)
    return value


def _unsupported(param: str, backend: LlmBackend, model: str, what: str = "") -> ServiceError:
    return invalid_argument(f"`{param}` {what or 'is not supported'} by the {backend.name} backend of "
                            f"model `{model}`; leave it at its default.", param)


def _require(backend: LlmBackend, knob: Knob, param: str, model: str) -> None:
    if not backend.supports(knob):
        raise _unsupported(param, backend, model)


def check_request(request: llm_pb2.GenerateRequest, prompts: int, max_choices: int, max_n: int = MAX_N) -> int:
    """`n` (0 means 1), within the model's bounds (`max_n`, `max_choices`); returns it."""
    n = request.n or 1
    if n > max_n:
        raise invalid_argument(f"`n` must be between 1 and {max_n} (max_n); got {n}.", "n")
    if prompts * n > max_choices:
        raise invalid_argument(f"{prompts} prompts with n={n} ask for {prompts * n} completions; at most "
                               f"{max_choices} (max_choices) are allowed per request.", "n")
    return n


def _logit_bias(request: llm_pb2.GenerateRequest, backend: LlmBackend, model: str, vocab: int) -> list[list[int]]:
    """Bans (bias -100) become bad words; other biases need a backend knob no adapter has yet."""
    bans = []
    for token, bias in sorted(request.logit_bias.items()):
        _finite(bias, -100, 100, "logit_bias")
        if token >= vocab:
            raise invalid_argument(f"`logit_bias` names token id {token}, outside the vocabulary of `{model}` "
                                   f"(0..{vocab - 1}).", "logit_bias")
        if bias == 0:
            continue
        if bias > -100 or not backend.supports("bad_words"):
            raise _unsupported("logit_bias", backend, model, "other than -100 (a ban) is not supported")
        bans.append([token])
    return bans


def sampling(request: llm_pb2.GenerateRequest, defaults: Defaults, backend: LlmBackend, model: str, vocab: int,
             tokenize: Callable[[str], list[int]]) -> tuple[Sampling, list[str]]:
    """The request's sampling (without max_new_tokens and seed, which are per choice) and stop strings."""
    temperature = _finite(request.temperature if request.HasField("temperature") else
                          defaults.temperature if defaults.temperature is not None else 1.0, 0, 2, "temperature")
    top_p = _finite(request.top_p if request.HasField("top_p") else
                    defaults.top_p if defaults.top_p is not None else 1.0, 0, 1, "top_p")
    top_k = request.top_k if request.HasField("top_k") else defaults.top_k or 0
    repetition = request.repetition_penalty if request.HasField("repetition_penalty") else \
        defaults.repetition_penalty if defaults.repetition_penalty is not None else 1.0
    if not (math.isfinite(repetition) and repetition > 0):
        raise invalid_argument(f"`repetition_penalty` must be a finite number greater than 0; got {repetition:g}.",
                               "repetition_penalty")
    if repetition != 1.0:
        _require(backend, "repetition_penalty", "repetition_penalty", model)
    if top_k and top_k != 1:
        _require(backend, "top_k", "top_k", model)
    presence = _finite(request.presence_penalty, -2, 2, "presence_penalty")
    frequency = _finite(request.frequency_penalty, -2, 2, "frequency_penalty")
    if presence:
        _require(backend, "presence_penalty", "presence_penalty", model)
    if frequency:
        _require(backend, "frequency_penalty", "frequency_penalty", model)
    if request.logprobs:
        _require(backend, "logprobs", "logprobs", model)
        if request.top_logprobs:
            raise _unsupported("top_logprobs", backend, model, "(alternatives per token) is not supported")
        if request.echo:
            raise invalid_argument("`echo` with `logprobs` is not supported: the backend returns no log "
                                   "probabilities for prompt tokens.", "echo")
    stops = list(dict.fromkeys(request.stop))
    if len(stops) > MAX_STOPS:
        raise invalid_argument(f"`stop` may hold at most {MAX_STOPS} strings; got {len(stops)}.", "stop")
    if any(stop == "" for stop in stops):
        raise invalid_argument("`stop` strings must not be empty.", "stop")
    greedy = temperature == 0 or top_p == 0 or top_k == 1 or (request.HasField("do_sample") and not request.do_sample)
    stop_words = list(defaults.stop_words or [])
    if backend.supports("stop_words"):  # the backend stops on them early; the text match is what counts
        stop_words += [ids for ids in map(tokenize, stops) if len(ids) == 1]
    bad_words = list(defaults.bad_words or []) + _logit_bias(request, backend, model, vocab)
    if bad_words and not backend.supports("bad_words"):
        raise _unsupported("logit_bias", backend, model)
    return Sampling(max_new_tokens=0, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition, presence_penalty=presence, frequency_penalty=frequency,
                    end_id=defaults.end_id, start_id=defaults.start_id, stop_words=stop_words,
                    bad_words=bad_words, logprobs=request.logprobs), stops


def max_new_tokens(request: llm_pb2.GenerateRequest, prompt_tokens: int, max_len: int, prompt_param: str,
                   cap: int | None = None) -> int:
    """`max_tokens`, or the rest of the context (at most `cap`, the model's `max_completion_tokens`); a
    prompt that leaves no room is refused."""
    chat = prompt_param == "messages"
    if prompt_tokens >= max_len:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"This model's maximum context length is {max_len} tokens. However, your "
                           f"{prompt_param} resulted in {prompt_tokens} tokens. Please reduce the length of the "
                           f"{prompt_param}.", prompt_param, "context_length_exceeded")
    if not request.HasField("max_tokens"):
        return min(max_len - prompt_tokens, cap or max_len)
    wanted = request.max_tokens
    if cap is not None and wanted > cap:
        raise invalid_argument(f"`max_tokens` is {wanted}; this model generates at most {cap} tokens per "
                               "completion (max_completion_tokens).", "max_tokens")
    if wanted == 0 and (chat or not request.echo):
        raise invalid_argument("`max_tokens` must be at least 1" + ("." if chat else " (0 only with `echo`)."),
                               "max_tokens")
    if prompt_tokens + wanted > max_len:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"This model's maximum context length is {max_len} tokens. However, you requested "
                           f"{prompt_tokens + wanted} tokens ({prompt_tokens} in the {prompt_param}, {wanted} in "
                           f"the completion). Please reduce the length of the {prompt_param} or completion.",
                           "max_tokens", "context_length_exceeded")
    return wanted


def choice_seeds(request: llm_pb2.GenerateRequest, n: int) -> list[int]:
    """Completion i of a prompt samples with seed + i (unsigned 64-bit); no seed: random seeds."""
    base = request.seed if request.HasField("seed") else random.getrandbits(64)
    return [(base + i) % 2**64 for i in range(n)]


def for_choice(base: Sampling, max_new: int, seed: int, request_id: str = "") -> Sampling:
    return replace(base, max_new_tokens=max_new, seed=seed, request_id=request_id)
