"""The one interface between the LLM service and a Triton LLM backend.

Backends differ in tensor names, in what they stream (FasterTransformer: the whole sequence so far on
every response; TensorRT-LLM: only the new tokens; its ensemble and vLLM: new text) and in which sampling
knobs they have. An adapter hides all of it: it takes a prompt (token ids, and the same prompt as text for
backends that tokenize themselves) and backend-neutral `Sampling`, and yields `Step`s holding only what
was generated since the previous step: token ids, or text. Everything above it (templates, stop strings,
detokenization of token steps, n choices, usage, finish reasons) is the same for every backend.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from services.llm.lora import Adapter

# Sampling features a request may need and a backend may lack.
Knob = Literal[
    "presence_penalty", "frequency_penalty", "logprobs", "bad_words", "stop_words", "seed", "top_k",
    "repetition_penalty",
    "logit_bias",  # bans (-100) of single token ids
    "min_p", "min_tokens", "ignore_eos",
    "top_logprobs",  # the most likely alternatives at each position
    "prompt_logprobs",  # the prompt tokens' log probabilities (completions' `echo` with `logprobs`)
    "special_tokens",  # special tokens decoded into the text (skip_special_tokens: false)
    "guided_decoding",  # output held to a JSON Schema, a grammar or a regex (response_format, tool_choice)
    "lora",  # LoRA adapters (services/llm/lora.py)
    "images",  # images in the chat messages (the Triton model declares an image input)
]

# Finish reasons a backend may report; without one the service decides from the token count.
FinishReason = Literal["stop", "length"]

# What guided decoding holds the text to: JSON matching a JSON Schema, a grammar (xgrammar's EBNF), or a
# regular expression.
GuideKind = Literal["json_schema", "grammar", "regex"]


@dataclass(frozen=True)
class Guide:
    """A constraint the backend's guided decoding enforces on the generated text: its kind, and the JSON
    Schema (as JSON text), the grammar or the regular expression."""

    kind: GuideKind
    text: str


@dataclass
class Sampling:
    """How to generate one completion, after defaults and validation."""

    max_new_tokens: int
    greedy: bool
    temperature: float = 1.0
    top_k: int = 0  # 0: no limit
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0  # unsigned 64-bit
    end_id: int | None = None
    start_id: int | None = None
    stop_words: list[list[int]] = field(default_factory=list)  # token-id words the backend may stop on
    bad_words: list[list[int]] = field(default_factory=list)  # token-id words it must not generate
    logprobs: bool = False
    request_id: str = ""  # shown in Triton's logs and traces: the client request id and choice index
    min_p: float = 0.0  # 0: off
    min_tokens: int = 0  # the end id and stops may not end a completion before this many tokens
    ignore_eos: bool = False  # generate past the end id
    top_logprobs: int = 0  # alternatives per position (with logprobs)
    skip_special_tokens: bool = True
    include_stop_str: bool = False  # the stop string that ended the completion stays in its text
    stop: list[str] = field(default_factory=list)  # stop strings, for backends that take text
    bad: list[str] = field(default_factory=list)  # banned words as text, for backends that take text
    guide: Guide | None = None  # what the output must match, by guided decoding; None: free text
    adapter: Adapter | None = None  # the LoRA adapter the request names; None: the base model
    images: list[bytes] = field(default_factory=list)  # the chat's image files, in order (backends with "images")
    beam_width: int = 1  # beam search with this many beams; 1: sampling (or greedy)
    prompt_logprobs: bool = False  # the prompt tokens' log probabilities too (with `top_logprobs` alternatives)
    priority: int = 0  # the request's (GenerateRequest.priority); Triton's level where the model has levels


@dataclass(frozen=True)
class PromptLogprob:
    """One prompt token's log probability given the tokens before it (None for the first token, which
    nothing predicts) and the `top_logprobs` most likely tokens at its position (token id, log probability)."""

    token: int
    logprob: float | None
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Step:
    """What was generated since the previous step.

    Token-level backends fill `token_ids` (and `logprobs` when asked for). Text-level backends fill `text`
    (the new text; "" when a response brought none) and, where they report them, `tokens` (how many tokens
    this text is), `token_ids` with `logprobs` and `top_logprobs` (alternatives as (token id, log
    probability), most likely first), `finish_reason` and `prompt_tokens` (the prompt as the backend
    tokenized it). Any step may say how many of the prompt's tokens the backend took from its cache of
    earlier prompts (`cached_tokens`, where it reports reuse). When the sampling asks for the prompt's log
    probabilities, the first step carries them (`prompt_logprobs`, one per prompt token as the backend
    tokenized the prompt).

    With beam search (`Sampling.beam_width` > 1) a step fills `beams` instead: every beam's token ids
    generated so far, the best first. Each step holds the whole beams, not what is new: until the search
    ends it may rewrite a beam's earlier tokens, or reorder the beams.
    """

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = None
    text: str | None = None
    tokens: int | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: FinishReason | None = None
    prompt_tokens: int | None = None
    beams: list[list[int]] | None = None
    cached_tokens: int | None = None
    prompt_logprobs: list[PromptLogprob] | None = None


class LlmBackend(Protocol):
    """What the service needs from a Triton LLM backend."""

    @property
    def name(self) -> str:
        """The backend's name in messages (`fastertransformer`, `tensorrt_llm`, ...)."""

    @property
    def takes_text(self) -> bool:
        """Whether the backend tokenizes the prompt itself and streams text (`stream` gets the prompt's
        text, steps carry text); token-level backends get token ids and stream token ids."""

    @property
    def beam_widths(self) -> Sequence[int]:
        """The beam widths above 1 beam search takes on the Triton model (known once configured); empty:
        no beam search."""

    def configure(self, triton_config: dict[str, Any]) -> None:
        """Read the Triton model's configuration (each time the model becomes ready); raise ServiceError
        FAILED_PRECONDITION when the model does not have the interface the adapter expects."""

    def supports(self, knob: Knob) -> bool:
        """Whether the backend can honour `knob` (a request that needs a missing knob is refused)."""

    def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
               ) -> AsyncGenerator[Step, None]:
        """Generate one completion of `prompt` (token ids; `text` is the same prompt as text). Closing the
        iterator cancels the request inside Triton."""
