"""What chat and completions requests and responses share: field types and validators, stream options,
and the `Shape` each endpoint gives its responses and stream chunks."""

from __future__ import annotations

from typing import Annotated, Any, Protocol

from pydantic import Field

from edge.errors import bad_request
from edge.protocol.common import OpenAIRequest
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

MAX_STOPS = 4
MAX_N = 16

Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
N = Annotated[int, Field(ge=1, le=MAX_N)]
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64)]
TopK = Annotated[int, Field(ge=-1)]  # -1 (vLLM) and 0 both mean no limit
RepetitionPenalty = Annotated[float, Field(gt=0)]


class StreamOptions(OpenAIRequest):
    include_usage: bool | None = None


def stop_list(value: Any) -> list[str]:
    """`stop`: a string or up to 4 non-empty strings."""
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise ValueError("'stop' must be a string or an array of strings")
    if len(stops) > MAX_STOPS:
        raise ValueError(f"'stop' may hold at most {MAX_STOPS} strings; got {len(stops)}")
    if any(stop == "" for stop in stops):
        raise ValueError("'stop' strings must not be empty")
    return stops


def logit_bias_map(value: Any) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys (strings)."""
    if not isinstance(value, dict):
        raise ValueError("'logit_bias' must be an object mapping token ids to biases")
    bias = {}
    for key, weight in value.items():
        if not str(key).strip().isdigit() or int(key) >= 2**32:
            raise ValueError(f"'logit_bias' keys must be token ids; got {key!r}")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not -100 <= weight <= 100:
            raise ValueError(f"'logit_bias' values must be numbers between -100 and 100; got {weight!r}")
        bias[int(key)] = float(weight)
    return bias


def check_stream_options(stream: bool | None, stream_options: StreamOptions | None) -> None:
    if stream_options is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true.", "stream_options")


def set_sampling(proto: llm_pb2.GenerateRequest, *, temperature: float | None, top_p: float | None,
                 top_k: int | None, repetition_penalty: float | None, presence_penalty: float | None,
                 frequency_penalty: float | None, seed: int | None, do_sample: bool | None) -> None:
    """Optional sampling fields: unset stays unset, so the model's defaults apply."""
    if temperature is not None:
        proto.temperature = temperature
    if top_p is not None:
        proto.top_p = top_p
    if top_k is not None:
        proto.top_k = max(top_k, 0)
    if repetition_penalty is not None:
        proto.repetition_penalty = repetition_penalty
    if presence_penalty is not None:
        proto.presence_penalty = presence_penalty
    if frequency_penalty is not None:
        proto.frequency_penalty = frequency_penalty
    if seed is not None:
        proto.seed = seed if seed < 2**63 else seed - 2**64
    if do_sample is not None:
        proto.do_sample = do_sample


def usage_object(usage: common_pb2.Usage) -> dict[str, int]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens}


class Collected:
    """One choice of a non-streamed response."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.logprobs: list[llm_pb2.TokenLogprob] = []
        self.finish_reason = "stop"

    @property
    def text(self) -> str:
        return "".join(self.parts)


class Shape(Protocol):
    """How one endpoint shapes its stream chunks and its response."""

    object: str  # of a stream chunk
    prefix: str  # of the response id
    logprobs: bool

    def opening(self, index: int) -> dict[str, Any] | None:
        """The choice of a chunk sent before any text, or None."""

    def delta(self, delta: llm_pb2.Delta) -> dict[str, Any]:
        """The choice of a chunk carrying text."""

    def end(self, index: int, finish_reason: str) -> dict[str, Any]:
        """The choice of a choice's last chunk: no text, the finish reason."""

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        """The whole non-streamed response."""
