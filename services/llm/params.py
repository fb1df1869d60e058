"""OpenAI request parameters → backend-neutral `Sampling`, under one model's `GenerationPolicy`: the
`model_infos` defaults where the request says nothing, the model's limits, validation that names the
parameter, and refusals for knobs the backend lacks (a default value is never refused).

The OpenAI request shape is the edge's (value ranges, `stop` count and emptiness, roles, `max_tokens: 0`
only with `echo`, ...); what is checked here depends on the model: its vocabulary, context length,
`max_n`, `max_choices`, `max_completion_tokens` and the knobs its backend has.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import grpc

from services.common.errors import ServiceError, invalid_argument
from services.llm.backends import Guide, Knob, LlmBackend, Sampling
from tritongate.config import LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import NO_REQUEST

DEFAULT_CONTEXT = 2048
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
COMPLETION_DEFAULT_TOKENS = 16  # a completion without max_tokens, as OpenAI's completions API and vLLM

PromptParam = Literal["messages", "prompt"]  # the request parameter that holds the prompts


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
    """One model's generation defaults (`model_infos`), for what a request leaves out."""

    end_id: int | None
    start_id: int | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    stop_words: list[list[int]] = field(default_factory=list)  # token-id words
    bad_words: list[list[int]] = field(default_factory=list)
    max_new_tokens: int | None = None  # for a request without max_tokens; None: the rest of the context

    @classmethod
    def of(cls, info: ModelInfo, tokenizer: Any) -> Defaults:
        """A negative `end_id` (Denglin's openai_api writes e.g. `"end_id": -2`) means the tokenizer's; a
        negative `start_id`, none."""
        end_id = info.end_id if info.end_id is not None and info.end_id >= 0 else tokenizer.eos_token_id
        start_id = info.start_id if info.start_id is not None and info.start_id >= 0 else None
        return cls(end_id, start_id, info.temperature, info.top_k, info.top_p, info.repetition_penalty,
                   info.stop_words, info.bad_words, info.max_completion_tokens)


@dataclass(frozen=True)
class GenerationPolicy:
    """What a request's checks and sampling need to know about one model, built once per model."""

    model: str  # the public id, named in messages
    defaults: Defaults
    backend: LlmBackend  # asked which knobs it has (known once the Triton model is ready)
    vocab_size: int
    tokenize: Callable[[str], list[int]]  # text → token ids without special tokens (stop strings)
    detokenize: Callable[[list[int]], str]  # token ids → text, special tokens kept (words for text backends)
    context_length: int  # prompt plus completion, in tokens
    max_n: int
    max_choices: int  # completions per request: prompts times n
    max_completion_tokens: int | None  # None: the rest of the context
    hosted_tools: Literal["ignore", "refuse"] = "ignore"  # what a request naming hosted tools gets

    @classmethod
    def of(cls, entry: LlmModel, info: ModelInfo, tokenizer: Any, backend: LlmBackend) -> GenerationPolicy:
        return cls(
            model=entry.name,
            defaults=Defaults.of(info, tokenizer),
            backend=backend,
            vocab_size=len(tokenizer),
            tokenize=lambda text: list(tokenizer.encode(text, add_special_tokens=False)),
            detokenize=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=False)),
            context_length=context_length(info, tokenizer, entry.path),
            max_n=entry.max_n,
            max_choices=entry.max_choices,
            max_completion_tokens=entry.max_completion_tokens,
            hosted_tools=entry.hosted_tools,
        )

    def stop_tokens(self, ignore_eos: bool = False) -> list[list[int]]:
        """Token-id words that end a completion: the end id (unless ignored) and `model_infos` `stop_words`."""
        end = [[self.defaults.end_id]] if self.defaults.end_id is not None and not ignore_eos else []
        return end + self.defaults.stop_words

    def words_as_text(self, words: list[list[int]]) -> list[str]:
        """`model_infos` token-id words as text, for backends that take text."""
        return [self.detokenize(word) for word in words] if self.backend.takes_text else []

    def check_backend(self) -> None:
        """Once the backend is known: `model_infos` asks nothing of it that it cannot do."""
        if self.defaults.bad_words and not self.backend.supports("bad_words"):
            raise ServiceError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"model `{self.model}`: `bad_words` of model_infos need bad word lists, which the "
                               f"{self.backend.name} backend does not have")

    def unsupported(self, param: str, what: str = "") -> ServiceError:
        return invalid_argument(f"`{param}` {what or 'is not supported'} by the {self.backend.name} backend of "
                                f"model `{self.model}`; leave it at its default.", param)

    def require(self, knob: Knob, param: str) -> None:
        if not self.backend.supports(knob):
            raise self.unsupported(param)


def check_request(request: llm_pb2.GenerateRequest, policy: GenerationPolicy, prompts: int) -> int:
    """`n` (0 means 1), within the model's bounds (`max_n`, `max_choices`); returns it. Hosted tools are
    refused where the model is configured to refuse them."""
    if request.hosted_tools and policy.hosted_tools == "refuse":
        tool = request.hosted_tools[0]
        raise invalid_argument(f"`{tool.param}` is a hosted tool (`{tool.type}`), which cannot run here: model "
                               f"`{policy.model}` is configured to refuse hosted tools (hosted_tools: \"refuse\"); "
                               "leave them out of the request.", tool.param)
    n = request.n or 1
    if n > policy.max_n:
        raise invalid_argument(f"`n` must be between 1 and {policy.max_n} (max_n); got {n}.", "n")
    if prompts * n > policy.max_choices:
        raise invalid_argument(f"{prompts} prompts with n={n} ask for {prompts * n} completions; at most "
                               f"{policy.max_choices} (max_choices) are allowed per request.", "n")
    return n


def _logit_bias(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> list[list[int]]:
    """Bans (bias -100) become bad words; other biases need a backend knob no adapter has yet."""
    bans = []
    vocab = policy.vocab_size
    for token, bias in sorted(request.logit_bias.items()):
        if token >= vocab:
            raise invalid_argument(f"`logit_bias` names token id {token}, outside the vocabulary of "
                                   f"`{policy.model}` (0..{vocab - 1}).", "logit_bias")
        if bias == 0:
            continue
        if bias > -100 or not policy.backend.supports("logit_bias"):
            raise policy.unsupported("logit_bias", "other than -100 (a ban) is not supported")
        bans.append([token])
    return bans


def _penalties(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> tuple[float, float, float]:
    """repetition_penalty (or the model's default), presence_penalty and frequency_penalty, where the
    backend has them."""
    defaults = policy.defaults
    repetition = request.repetition_penalty if request.HasField("repetition_penalty") else \
        defaults.repetition_penalty if defaults.repetition_penalty is not None else 1.0
    if repetition != 1.0:
        policy.require("repetition_penalty", "repetition_penalty")
    presence, frequency = request.presence_penalty, request.frequency_penalty
    if presence:
        policy.require("presence_penalty", "presence_penalty")
    if frequency:
        policy.require("frequency_penalty", "frequency_penalty")
    return repetition, presence, frequency


# What a Triton model declares for the prompt tokens' log probabilities (docs/backends.md).
CONTEXT_LOGITS_HINT = "a return_context_logits input and a context_logits output"
PROMPT_LOGPROBS_HINT = {"vllm": "a return_prompt_logprobs input and a prompt_logprobs output"}


def _logprobs(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> int:
    """Checks `logprobs` and `top_logprobs`; the number of alternatives per position."""
    if not request.logprobs:
        return 0
    policy.require("logprobs", "logprobs")
    if request.top_logprobs and not policy.backend.supports("top_logprobs"):
        raise policy.unsupported("top_logprobs", "(alternatives per token) is not supported")
    if request.echo and not policy.backend.supports("prompt_logprobs"):
        raise invalid_argument(f"`echo` with `logprobs` needs the prompt tokens' log probabilities, which the "
                               f"{policy.backend.name} backend of model `{policy.model}` does not return: its "
                               f"Triton model declares no "
                               f"{PROMPT_LOGPROBS_HINT.get(policy.backend.name, CONTEXT_LOGITS_HINT)}.", "echo")
    return request.top_logprobs


def _extensions(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> dict[str, Any]:
    """vLLM's extensions (min_p, min_tokens, ignore_eos, skip_special_tokens, include_stop_str_in_output),
    refused where the backend cannot honour them; Sampling fields."""
    skip_special = not request.HasField("skip_special_tokens") or request.skip_special_tokens
    checks: tuple[tuple[Knob, bool], ...] = (("min_p", request.min_p > 0), ("min_tokens", request.min_tokens > 0),
                                             ("ignore_eos", request.ignore_eos), ("special_tokens", not skip_special))
    for knob, used in checks:
        if used:
            policy.require(knob, "skip_special_tokens" if knob == "special_tokens" else knob)
    return {"min_p": request.min_p, "min_tokens": request.min_tokens, "ignore_eos": request.ignore_eos,
            "skip_special_tokens": skip_special, "include_stop_str": request.include_stop_str_in_output}


# What `json_object` is enforced as: any JSON object (a backend's plain "json" would allow any JSON value).
OBJECT_SCHEMA = '{"type": "object"}'


def guide_of(guide: llm_pb2.Guide) -> Guide | None:
    """The constraint a `Guide` message asks for (None: none)."""
    kind = guide.WhichOneof("kind")
    if kind == "grammar":
        return Guide("grammar", guide.grammar)
    if kind == "regex":
        return Guide("regex", guide.regex)
    return None if kind is None else Guide("json_schema", guide.json_schema if kind == "json_schema" else OBJECT_SCHEMA)


def guided(policy: GenerationPolicy, param: str, what: str) -> None:
    """Refuse `param` on a backend without guided decoding: the format could only be hoped for."""
    if not policy.backend.supports("guided_decoding"):
        raise invalid_argument(f"`{param}` {what} cannot be enforced by the {policy.backend.name} backend of model "
                               f"`{policy.model}`: it has no guided decoding.", param)


def response_format(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> Guide | None:
    """What `response_format` asks the text to match (None for free text)."""
    guide = guide_of(request.guide)
    if guide is not None:
        guided(policy, "response_format", f"of type {request.guide.WhichOneof('kind')!r}")
    return guide


def beam_width(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> int:
    """`num_beams` (0 means 1: no beam search), a width the model's backend takes, at least `n`, and
    without what beam search here cannot do: log probabilities (each beam's are not read) and guided
    decoding (TensorRT-LLM's grammar matcher follows one sequence)."""
    width = request.beam_width or 1
    if width == 1:
        return 1
    widths = list(policy.backend.beam_widths)
    if not widths:
        raise invalid_argument(f"`num_beams` (beam search) is not supported by the {policy.backend.name} backend of "
                               f"model `{policy.model}`; leave it at 1.", "num_beams")
    if width not in widths:
        allowed = f"between 1 and {widths[-1]}" if widths == list(range(2, widths[-1] + 1)) else \
            f"one of 1, {', '.join(map(str, widths))}"
        raise invalid_argument(f"`num_beams` must be {allowed} on model `{policy.model}` (max_beams); got {width}.",
                               "num_beams")
    n = request.n or 1
    if n > width:
        raise invalid_argument(f"`n` is {n}, more than `num_beams` ({width}): the completions of a prompt are its "
                               "best beams.", "n")
    chat = request.chat
    forced = bool(chat.tools) and (chat.tool_choice.mode == "required" or bool(chat.tool_choice.function))
    for param, used in (("logprobs", request.logprobs), ("response_format", request.HasField("guide")),
                        ("tool_choice", forced)):
        if used:
            raise invalid_argument(f"`{param}` cannot be combined with `num_beams` (beam search).", param)
    return width


def sampling(request: llm_pb2.GenerateRequest, policy: GenerationPolicy) -> tuple[Sampling, list[str]]:
    """The request's sampling (without max_new_tokens and seed, which are per choice) and the stop strings
    the service matches (for backends that take text, `model_infos` `stop_words` too, as text)."""
    defaults, backend = policy.defaults, policy.backend
    temperature = request.temperature if request.HasField("temperature") else \
        defaults.temperature if defaults.temperature is not None else 1.0
    top_p = request.top_p if request.HasField("top_p") else defaults.top_p if defaults.top_p is not None else 1.0
    top_k = request.top_k if request.HasField("top_k") else defaults.top_k or 0
    if top_k and top_k != 1:
        policy.require("top_k", "top_k")
    repetition, presence, frequency = _penalties(request, policy)
    alternatives = _logprobs(request, policy)
    extensions = _extensions(request, policy)
    stops = list(dict.fromkeys(request.stop))
    greedy = temperature == 0 or top_p == 0 or top_k == 1 or (request.HasField("do_sample") and not request.do_sample)
    # With min_tokens the service alone matches stop words: a backend's stop words would end completions early.
    stop_words = [] if request.min_tokens else list(defaults.stop_words)
    if backend.supports("stop_words") and not request.min_tokens:  # it stops early; the text match counts
        stop_words += [ids for ids in map(policy.tokenize, stops) if len(ids) == 1]
    bad_words = list(defaults.bad_words) + _logit_bias(request, policy)
    if bad_words and not backend.supports("bad_words"):
        raise policy.unsupported("logit_bias")
    text_stops = stops + policy.words_as_text(defaults.stop_words)
    return Sampling(max_new_tokens=0, greedy=greedy, temperature=temperature, top_k=top_k, top_p=top_p,
                    repetition_penalty=repetition, presence_penalty=presence, frequency_penalty=frequency,
                    end_id=defaults.end_id, start_id=defaults.start_id, stop_words=stop_words,
                    bad_words=bad_words, logprobs=request.logprobs, top_logprobs=alternatives,
                    stop=text_stops if backend.takes_text else [], bad=policy.words_as_text(defaults.bad_words),
                    guide=response_format(request, policy), beam_width=beam_width(request, policy),
                    prompt_logprobs=request.logprobs and request.echo, priority=request.priority,
                    **extensions), text_stops


def max_new_tokens(request: llm_pb2.GenerateRequest, policy: GenerationPolicy, prompt_tokens: int,
                   param: PromptParam) -> int:
    """`max_tokens` (0 generates nothing), or the default: the model's (`model_infos` `max_completion_tokens`),
    for a completion of prompts at most 16 (OpenAI's and vLLM's default), raised to `min_tokens`; within
    the rest of the context and the model's limit (`llm[]` `max_completion_tokens`); a prompt that leaves
    no room, or `min_tokens` beyond it, is refused. A `max_tokens` beyond the room or the limit is refused
    too, unless the request asks for it to be cut to what they allow (`fit_max_tokens`)."""
    max_len, cap = policy.context_length, policy.max_completion_tokens
    if prompt_tokens >= max_len:
        raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                           f"This model's maximum context length is {max_len} tokens. However, your "
                           f"{param} resulted in {prompt_tokens} tokens. Please reduce the length of the "
                           f"{param}.", param, "context_length_exceeded")
    if request.HasField("max_tokens") and request.fit_max_tokens:
        wanted = min(request.max_tokens, max_len - prompt_tokens, cap or max_len)
    elif request.HasField("max_tokens"):
        wanted = request.max_tokens
        if cap is not None and wanted > cap:
            raise invalid_argument(f"`max_tokens` is {wanted}; this model generates at most {cap} tokens per "
                                   "completion (max_completion_tokens).", "max_tokens")
        if prompt_tokens + wanted > max_len:
            raise ServiceError(grpc.StatusCode.INVALID_ARGUMENT,
                               f"This model's maximum context length is {max_len} tokens. However, you requested "
                               f"{prompt_tokens + wanted} tokens ({prompt_tokens} in the {param}, {wanted} in "
                               f"the completion). Please reduce the length of the {param} or completion.",
                               "max_tokens", "context_length_exceeded")
    else:
        default = policy.defaults.max_new_tokens or max_len
        if request.WhichOneof("input") == "prompts":  # the model's own default, where smaller, still holds
            default = min(default, COMPLETION_DEFAULT_TOKENS)
        wanted = min(max_len - prompt_tokens, cap or max_len, max(default, request.min_tokens))
    if request.min_tokens > wanted:
        raise invalid_argument(f"`min_tokens` is {request.min_tokens}, more than the {wanted} tokens this "
                               "completion may generate.", "min_tokens")
    return wanted


def choice_seeds(request: llm_pb2.GenerateRequest, n: int) -> list[int]:
    """Completion i of a prompt samples with seed + i (unsigned 64-bit); no seed: random seeds."""
    base = request.seed if request.HasField("seed") else random.getrandbits(64)
    return [(base + i) % 2**64 for i in range(n)]


def for_choice(base: Sampling, max_new: int, seed: int, request_id: str, index: int) -> Sampling:
    """Choice `index`'s sampling. Its Triton request id "<request id>-<index>" ties Triton's logs and
    traces to the client's request (none when the RPC carried no id)."""
    return replace(base, max_new_tokens=max_new, seed=seed,
                   request_id=f"{request_id}-{index}" if request_id != NO_REQUEST else "")
