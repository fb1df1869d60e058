"""The one input of every generation front end: chat, completions, Responses, Anthropic's Messages and
LMDeploy's interactive chat each convert their own request straight into a `GenerationInput`, and the
generation path (edge/streaming.py) sends its GenerateRequest to the llm service.

A front end validates its request under its own names (pydantic, and `ParamError`s naming the client's
own parameter path, such as `input[3].content`), every rule while validating, so that converting the
validated request cannot fail; it never passes through another endpoint's request.
What the llm service refuses is named by the GenerateRequest's fields (`max_tokens`, `response_format`,
`messages`, ...): `names` maps each to what this front end's client calls it, so that the refusal names
the client's parameter too (edge/clients.py applies it to the service's errors).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from edge.images import PendingImage
from tritongate.llm.v1 import llm_pb2

INT64_LIMIT = 2**63  # seeds from 2^63 to 2^64 - 1 (OpenAI allows them) travel as their int64 bit pattern


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """How the client asked to sample; None leaves the model's default (the proto's optional field stays
    unset). The llm service resolves it into the backend's own `Sampling`."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # -1 (vLLM) and 0 both mean no limit
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    do_sample: bool | None = None
    seed: int | None = None
    min_tokens: int | None = None
    skip_special_tokens: bool | None = None
    n: int = 1
    stop: Sequence[str] = ()
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    num_beams: int = 1  # beam search with this many beams; 1: none

    def fill(self, proto: llm_pb2.GenerateRequest) -> None:
        proto.n = self.n
        proto.beam_width = self.num_beams if self.num_beams > 1 else 0
        proto.stop.extend(self.stop)
        proto.logit_bias.update(self.logit_bias)
        proto.ignore_eos = self.ignore_eos
        proto.include_stop_str_in_output = self.include_stop_str_in_output
        optional = {"max_tokens": self.max_tokens, "temperature": self.temperature, "top_p": self.top_p,
                    "top_k": None if self.top_k is None else max(self.top_k, 0), "min_p": self.min_p,
                    "repetition_penalty": self.repetition_penalty, "presence_penalty": self.presence_penalty,
                    "frequency_penalty": self.frequency_penalty, "do_sample": self.do_sample,
                    "seed": None if self.seed is None else self.seed - 2**64 if self.seed >= INT64_LIMIT else self.seed,
                    "min_tokens": self.min_tokens, "skip_special_tokens": self.skip_special_tokens}
        for name, value in optional.items():
            if value is not None:
                setattr(proto, name, value)


@dataclass(frozen=True)
class Tooling:
    """A request's tools, how it lets the model call them, and its output format, as its validators checked
    them (chat's, Responses' and Anthropic's tools all become these)."""

    tools: Sequence[llm_pb2.Tool] = ()
    choice: llm_pb2.ToolChoice | None = None  # None: "auto" with tools, else "none"
    parallel: bool | None = None  # whether calls may be parallel; None: the default
    guide: llm_pb2.Guide | None = None  # the output's format (JSON, a JSON schema)

    @property
    def tool_choice(self) -> llm_pb2.ToolChoice:
        if self.choice is not None:
            return self.choice
        return llm_pb2.ToolChoice(mode="auto" if self.tools else "none")


@dataclass(frozen=True, slots=True)
class Affinity:
    """What names the generation's conversation for the choice of Triton endpoint (services/common/
    prefix_routing.py): the client's key (`prompt_cache_key`, `user`, Anthropic's `metadata.user_id`; an
    affinity header overrides it), and the tenant's cache salt. Both travel as digests: any size is fine."""

    key: str | None = None
    salt: str | None = None

    def fill(self, proto: llm_pb2.GenerateRequest, header: str | None) -> None:
        key = header or self.key
        if key:
            proto.affinity_key = _digest(key)
        if self.salt:
            proto.cache_salt = _digest(self.salt)


def _digest(value: str) -> bytes:
    return hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def affinity_header(headers: Mapping[str, str], name: str | None) -> str | None:
    """The value of the configured affinity header (TRITONGATE_AFFINITY_HEADER); None when unset or absent."""
    return headers.get(name) or None if name else None


@dataclass(frozen=True)
class GenerationInput:
    """One generation, whichever endpoint asked for it: a conversation (`messages`, with its tools and
    output format) or raw `prompts` (completions), how to sample, and how to answer."""

    model: str
    sampling: SamplingRequest
    messages: Sequence[llm_pb2.ChatMessage] = ()
    prompts: Sequence[llm_pb2.Prompt] = ()
    images: Sequence[PendingImage] = ()  # the messages' images, loaded into them before the request is sent
    stream: bool = False
    tooling: Tooling = field(default_factory=lambda: Tooling())  # the tools, how to use them, the output format
    template_variables: Mapping[str, Any] = field(default_factory=dict)  # extra variables of the chat template
    logprobs: bool = False
    top_logprobs: int = 0
    echo: bool = False  # completions: the prompt before the completion
    hosted_tools: Sequence[llm_pb2.HostedTool] = ()  # tools no model can run here: never offered to it
    fit_max_tokens: bool = False  # a max_tokens above the context's room is cut to it, not refused
    affinity: Affinity = Affinity()  # the conversation's key and the tenant's salt
    names: Mapping[str, str] = field(default_factory=dict)  # GenerateRequest field → the client's parameter

    def param(self, name: str) -> str:
        """What the client calls the generation parameter `name`."""
        return self.names.get(name, name)


    def proto(self, affinity_header: str | None = None) -> llm_pb2.GenerateRequest:
        """The GenerateRequest; `affinity_header`: the affinity header's value, which overrides the body's key."""
        proto = llm_pb2.GenerateRequest(model=self.model, logprobs=self.logprobs, top_logprobs=self.top_logprobs,
                                        echo=self.echo, hosted_tools=self.hosted_tools,
                                        fit_max_tokens=self.fit_max_tokens)
        self.sampling.fill(proto)
        if self.prompts:
            proto.prompts.prompts.extend(self.prompts)
        else:
            tooling = self.tooling
            chat = llm_pb2.Chat(messages=self.messages, tools=tooling.tools, tool_choice=tooling.tool_choice)
            if tooling.parallel is not None:
                chat.parallel_tool_calls = tooling.parallel
            proto.chat.CopyFrom(chat)
        if self.tooling.guide is not None:
            proto.guide.CopyFrom(self.tooling.guide)
        if self.template_variables:
            proto.chat_template_kwargs.update(dict(self.template_variables))
        self.affinity.fill(proto, affinity_header)
        return proto
