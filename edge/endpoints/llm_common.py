"""What chat and completions share: the request fields and their rules, their `SamplingRequest` (of the
one generation input, edge/generation.py), and the `Shape` each endpoint gives its responses and stream
chunks (the one generation path, edge/streaming.py, builds both endpoints' answers through it)."""

from __future__ import annotations

from typing import Annotated, Any, Protocol, Self

from pydantic import Field, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import UINT32_MAX, OpenAIRequest
from edge.errors import ParamError
from edge.generation import Affinity, SamplingRequest
from edge.keys.caller import Prioritized
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.wire import MAX_N, MAX_STOPS

FLOAT32_MAX = 3.4028234e38
FLOAT32_TINY = 1.1754944e-38  # the smallest normal float32: a positive penalty stays positive on the wire

Temperature = Annotated[float, Field(ge=0, le=2)]
TopP = Annotated[float, Field(ge=0, le=1)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
N = Annotated[int, Field(ge=1, le=MAX_N)]  # each model's own `max_n` is the llm service's to check
Seed = Annotated[int, Field(ge=-(2**63), lt=2**64)]
TopK = Annotated[int, Field(ge=-1, le=UINT32_MAX)]  # -1 (vLLM) and 0 both mean no limit
# Sent as float32: a larger value would arrive as infinity.
# vLLM's `cache_salt`: tenants with different salts never share a cached prefix (nor its routing).
CacheSalt = Annotated[str, Field(min_length=1)]
RepetitionPenalty = Annotated[float, Field(ge=FLOAT32_TINY, le=FLOAT32_MAX)]
# What the validators below accept, as /openapi.json declares it.
_STOP = {"type": "string", "minLength": 1}
Stop = Annotated[Any, WithJsonSchema({"anyOf": [_STOP, {"type": "array", "maxItems": MAX_STOPS, "items": _STOP},
                                                {"type": "null"}]})]
LogitBias = Annotated[dict[int, float] | None, WithJsonSchema({"anyOf": [
    {"type": "object", "propertyNames": {"pattern": "^[0-9]{1,9}$"},
     "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100}}, {"type": "null"}]})]


class StreamOptions(OpenAIRequest):
    include_usage: bool | None = None


def stop_list(value: Any, param: str = "stop") -> list[str]:
    """`stop` (or Anthropic's `stop_sequences`): a string or up to MAX_STOPS non-empty strings."""
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(stop, str) for stop in stops):
        raise ParamError(f"'{param}' must be a string or an array of strings", param)
    if len(stops) > MAX_STOPS:
        raise ParamError(f"'{param}' may hold at most {MAX_STOPS} strings; got {len(stops)}", param)
    if any(stop == "" for stop in stops):
        raise ParamError(f"'{param}' strings must not be empty", param)
    return stops


def logit_bias_map(value: Any) -> dict[int, float]:
    """OpenAI sends token ids as JSON object keys (strings)."""
    if not isinstance(value, dict):
        raise ParamError("'logit_bias' must be an object mapping token ids to biases", "logit_bias")
    bias = {}
    for key, weight in value.items():
        if not str(key).strip().isdigit() or int(key) > UINT32_MAX:
            raise ParamError(f"'logit_bias' keys must be token ids; got {key!r}", "logit_bias")
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not -100 <= weight <= 100:
            raise ParamError(f"'logit_bias' values must be numbers between -100 and 100; got {weight!r}",
                             "logit_bias")
        bias[int(key)] = float(weight)
    return bias


class GenerationRequest(OpenAIRequest, Prioritized):
    """The fields chat and completions requests share (OpenAI's, then our extensions), their rules,
    and their part of the proto."""

    model: str
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias = None
    n: N | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    # Extensions (vLLM, Chinese-LLaMA-Alpaca's server); the llm service refuses one its backend cannot honour.
    top_k: TopK | None = None
    repetition_penalty: RepetitionPenalty | None = None
    do_sample: bool | None = None
    # Beam search; each model's limit (`max_beams`, /v1/models) is the llm service's to check.
    num_beams: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    min_p: Annotated[float, Field(ge=0, le=1)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=UINT32_MAX)] | None = None
    ignore_eos: bool | None = False
    include_stop_str_in_output: bool | None = False
    skip_special_tokens: bool | None = None
    cache_salt: CacheSalt | None = None

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: Any) -> list[str] | None:
        return None if value is None else stop_list(value)

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _logit_bias(cls, value: Any) -> dict[int, float] | None:
        return None if value is None else logit_bias_map(value)

    @model_validator(mode="after")
    def _stream_options(self) -> Self:
        if self.stream_options is not None and not self.stream:
            raise ParamError("'stream_options' is only allowed when 'stream' is true.", "stream_options")
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def affinity(self) -> Affinity:
        return Affinity(self.prompt_cache_key or self.user, self.cache_salt)

    def sampling(self, max_tokens: int | None) -> SamplingRequest:
        """The shared fields as the generation's sampling (`max_tokens` is the endpoint's own field)."""
        return SamplingRequest(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, do_sample=self.do_sample, seed=self.seed,
            min_tokens=self.min_tokens, skip_special_tokens=self.skip_special_tokens, n=self.n or 1,
            stop=self.stop or (), logit_bias=self.logit_bias or {}, ignore_eos=bool(self.ignore_eos),
            include_stop_str_in_output=bool(self.include_stop_str_in_output), num_beams=self.num_beams or 1)


class Collected:
    """One choice of a non-streamed response."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.thoughts: list[str] = []  # a reasoning model's thinking
        self.logprobs: list[llm_pb2.TokenLogprob] = []
        self.finish_reason = "stop"
        self.stop_string = ""  # the stop string that ended the choice, if one did
        self.tool_calls: list[dict[str, str]] = []  # id, name, arguments (JSON text) of each call

    def add(self, delta: llm_pb2.Delta) -> None:
        self.parts.append(delta.text)
        self.thoughts.append(delta.reasoning)
        self.logprobs.extend(delta.logprobs)
        for piece in delta.tool_calls:
            while len(self.tool_calls) <= piece.index:
                self.tool_calls.append({"id": "", "name": "", "arguments": ""})
            call = self.tool_calls[piece.index]
            call["id"] = piece.id or call["id"]
            call["name"] = piece.name or call["name"]
            call["arguments"] += piece.arguments
        if delta.finish_reason:
            self.finish_reason = delta.finish_reason
            self.stop_string = delta.stop_string

    @property
    def text(self) -> str:
        return "".join(self.parts)

    @property
    def reasoning(self) -> str:
        return "".join(self.thoughts)


class Shape(Protocol):
    """How one endpoint shapes its stream chunks and its response."""

    object: str  # of a stream chunk
    prefix: str  # of the response id, its separator included

    def opening(self, index: int) -> dict[str, Any] | None:
        """The choice of a chunk sent before any text, or None."""

    def delta(self, delta: llm_pb2.Delta) -> dict[str, Any]:
        """The choice of a chunk carrying text."""

    def end(self, index: int, finish_reason: str) -> dict[str, Any]:
        """The choice of a choice's last chunk: no text, the finish reason."""

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        """The whole non-streamed response."""
