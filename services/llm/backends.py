"""The one interface between the LLM service and a Triton LLM backend.

Backends differ in tensor names, in what they stream (FasterTransformer: the whole sequence so far on
every response; TensorRT-LLM: only the new tokens; vLLM: new text) and in which sampling knobs they
have. An adapter hides all of it: it takes a prompt's token ids and backend-neutral `Sampling`, and
yields `Step`s holding only the tokens generated since the previous step. Everything above it
(templates, stop strings, detokenization, n choices, usage) is the same for every backend.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

# Sampling features a request may need and a backend may lack.
Knob = Literal["presence_penalty", "frequency_penalty", "logprobs", "bad_words", "stop_words", "seed", "top_k",
               "repetition_penalty"]


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


@dataclass
class Step:
    """Tokens generated since the previous step, with their log probabilities when asked for."""

    token_ids: list[int]
    logprobs: list[float] | None = None


class LlmBackend(Protocol):
    """What the service needs from a Triton LLM backend."""

    name: str

    def configure(self, triton_config: dict[str, Any]) -> None:
        """Read the Triton model's configuration (each time the model becomes ready); raise ServiceError
        FAILED_PRECONDITION when the model does not have the interface the adapter expects."""

    def supports(self, knob: Knob) -> bool:
        """Whether the backend can honour `knob` (a request that needs a missing knob is refused)."""

    def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None
               ) -> AsyncGenerator[Step, None]:
        """Generate one completion. Closing the iterator cancels the request inside Triton."""
