"""POST /v1/completions: the request in the order of OpenAI's CreateCompletionRequest (our extensions
last) with its rules, its generation input, and its response and stream chunks (the same object,
`text_completion`)."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal, Self

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import (
    UINT32_MAX,
    Head,
    ResponseModel,
    Usage,
    batch_schema,
    text_or_token_batch,
    usage_object,
)
from edge.endpoints.llm_common import Collected, GenerationRequest
from edge.errors import ParamError
from edge.generation import GenerationInput
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2


class CompletionRequest(GenerationRequest):
    """The completions fields (the shared ones are in GenerationRequest)."""

    prompt: Annotated[Any, WithJsonSchema(batch_schema(empty_strings=True))] = Field(...)
    best_of: Annotated[int, Field(ge=0, le=20)] | None = None
    echo: bool | None = False
    logprobs: Annotated[int, Field(ge=0, le=5)] | None = None
    max_tokens: Annotated[int, Field(ge=0, le=UINT32_MAX)] | None = None
    suffix: str | None = None
    # Extension (vLLM before 0.6.3): beam search with `best_of` beams (default: `n`), as `num_beams`.
    use_beam_search: bool | None = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value: Any) -> list[str] | list[list[int]]:
        return text_or_token_batch(value, "prompt", empty_strings=True)

    @model_validator(mode="after")
    def _rules(self) -> Self:
        if self.suffix:
            raise ParamError("'suffix' (insertion) is not supported.", "suffix")
        if self.best_of not in (None, self.n or 1) and not self.use_beam_search:
            raise ParamError("'best_of' is not supported unless it equals 'n' (or with 'use_beam_search': beams).",
                             "best_of")
        if self.use_beam_search and self.num_beams not in (None, self.beams):
            raise ParamError("'num_beams' and 'best_of' with 'use_beam_search' ask for different beams.", "num_beams")
        if self.max_tokens == 0 and not self.echo:
            raise ParamError("'max_tokens' must be at least 1 (0 only with 'echo').", "max_tokens")
        return self

    @property
    def beams(self) -> int:
        """The beam width: `num_beams`, or with `use_beam_search` `best_of` (default `n`)."""
        return (self.best_of or self.n or 1) if self.use_beam_search else self.num_beams or 1


def generation_input(body: CompletionRequest) -> GenerationInput:
    prompts = [llm_pb2.Prompt(text=p) if isinstance(p, str) else llm_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=p))
               for p in body.prompt]
    return GenerationInput(model=body.model, sampling=replace(body.sampling(body.max_tokens), num_beams=body.beams),
                           prompts=prompts, stream=bool(body.stream), echo=bool(body.echo),
                           logprobs=body.logprobs is not None, top_logprobs=body.logprobs or 0,
                           names={"num_beams": "best_of"} if body.use_beam_search else {}, affinity=body.affinity)


# The response (a stream chunk has the same shape), as /openapi.json declares it.
class CompletionLogprobs(ResponseModel):
    tokens: list[str]
    token_logprobs: list[float | None]  # null for the echoed prompt's first token
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: Literal["stop", "length"] | None  # null in stream chunks before the last


class Completion(Head):
    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage | None = None


class CompletionShape:
    object = "text_completion"
    prefix = "cmpl-"

    def __init__(self, logprobs: bool) -> None:
        self.logprobs = logprobs

    def _logprobs(self, entries: list[llm_pb2.TokenLogprob]) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        # The echoed prompt's first token has no log probability: null, as OpenAI and vLLM send it.
        known = [e.HasField("logprob") for e in entries]
        return {"tokens": [e.token for e in entries],
                "token_logprobs": [e.logprob if has else None for e, has in zip(entries, known, strict=True)],
                # The alternatives when the backend reports them, else the chosen token alone.
                "top_logprobs": [({t.token: t.logprob for t in e.top_logprobs} or {e.token: e.logprob}) if has
                                 else None for e, has in zip(entries, known, strict=True)],
                "text_offset": [e.text_offset for e in entries]}

    def opening(self, index: int) -> dict[str, Any] | None:
        return None

    def delta(self, delta: llm_pb2.Delta) -> dict[str, Any]:
        return {"index": delta.index, "text": delta.text, "logprobs": self._logprobs(list(delta.logprobs)),
                "finish_reason": None}

    def end(self, index: int, finish_reason: str) -> dict[str, Any]:
        return {"index": index, "text": "", "logprobs": None, "finish_reason": finish_reason}

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        return {
            **head,
            "object": "text_completion",
            "choices": [{"index": i, "text": c.text, "logprobs": self._logprobs(c.logprobs),
                         "finish_reason": c.finish_reason} for i, c in enumerate(choices)],
            "usage": usage_object(usage),
        }


def shape(body: CompletionRequest) -> CompletionShape:
    return CompletionShape(body.logprobs is not None)
