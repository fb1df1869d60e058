"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API, on the one generation path.

A Responses request becomes the generation input (`generation_input`): `instructions` the system
message, the stored conversation of `previous_response_id` and then `input` the messages
(edge/endpoints/response_input.py: calls and their outputs, reasoning items and developer messages
included), `text.format` the output format, and `tools` the tools (edge/endpoints/response_tools.py:
function tools through the rules chat uses for its own, custom tools with their grammars, namespaces,
hosted tools never offered), with errors naming this request's parameters; `reasoning.effort` reaches the
chat template as `reasoning_effort`, as chat's does. The answer is collected or streamed by the one
generation path (edge/streaming.py), written by edge/endpoints/response_output.py, its schemas declared in
edge/endpoints/response_schemas.py. A Response with `store` (the default) is kept, with the conversation
that led to it, in the state store that every edge process shares (edge/state/).

Fields a coding agent sends that mean nothing to the generation here (`prompt_cache_key`,
`safety_identifier`, `service_tier`, `truncation`, `text.verbosity`, `client_metadata`) are accepted and,
where a Response has them, echoed; `max_tool_calls: 1` allows one call (no parallel calls).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import Field, PrivateAttr, WithJsonSchema, field_validator, model_validator

from edge.endpoints.chat import ReasoningEffort
from edge.endpoints.common import UINT32_MAX, OpenAIRequest
from edge.endpoints.llm_common import CacheSalt, Temperature, TopP
from edge.endpoints.response_input import InputMessages, input_messages
from edge.endpoints.response_tools import (
    ResponseToolChoiceJson,
    ResponseTools,
    ResponseToolsJson,
    response_tool_choice,
    response_tools,
)
from edge.endpoints.tools import response_guide
from edge.errors import OpenAIError, bad_request
from edge.generation import Affinity, GenerationInput, SamplingRequest, Tooling
from edge.images import PendingImage
from edge.keys.caller import Prioritized
from edge.state import Space, conversation
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under their Responses names, for what the llm service refuses.
NAMES = {"response_format": "text.format", "max_tokens": "max_output_tokens", "messages": "input"}
ENCRYPTED_REASONING = "reasoning.encrypted_content"
ServiceTier = Literal["auto", "default", "flex", "scale", "priority", "fast", "ultrafast"]

Input = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1,
                                                                                      "items": {"type": "object"}}]})]


class ReasoningOptions(OpenAIRequest):
    """OpenAI's `reasoning`: `effort` reaches the chat template; no summaries are written."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class TextOptions(OpenAIRequest):
    """OpenAI's `text`: the output's `format` ({"type": "text" | "json_object" | "json_schema", ...}), and a
    `verbosity` that is accepted and echoed (a model here is not told of it)."""

    format: dict[str, Any] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponseRequest(OpenAIRequest, Prioritized):
    """What this server reads of OpenAI's CreateResponse (the rest is ignored, as elsewhere)."""

    model: str
    input: Input
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stream: bool | None = False
    store: bool | None = True
    text: TextOptions | None = None
    tools: ResponseToolsJson = None
    tool_choice: ResponseToolChoiceJson = None
    parallel_tool_calls: bool | None = None
    max_tool_calls: Annotated[int, Field(ge=1, le=UINT32_MAX)] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: ReasoningOptions | None = None
    include: list[str] | None = None  # only "reasoning.encrypted_content" changes the answer
    prompt_cache_key: str | None = None
    safety_identifier: Annotated[str, Field(max_length=64)] | None = None
    service_tier: ServiceTier | None = None
    truncation: Literal["auto", "disabled"] | None = None
    client_metadata: dict[str, Any] | None = None
    cache_salt: CacheSalt | None = None

    _tools: ResponseTools = PrivateAttr(default_factory=ResponseTools)  # `tools`, checked
    _tooling: Tooling = PrivateAttr(default_factory=Tooling)  # what the model is offered, and text.format

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> InputMessages:
        return input_messages(value)

    @model_validator(mode="after")
    def _check_tools(self) -> Self:
        self._tools = response_tools(self.tools) if self.tools is not None else ResponseTools()
        choice, offered = response_tool_choice(self.tool_choice, self._tools)
        parallel = False if self.max_tool_calls == 1 else self.parallel_tool_calls
        self._tooling = Tooling(offered, choice, parallel, response_guide(self.text.format if self.text else None,
                                                                          "text.format", nested=None))
        return self

    @property
    def tooling(self) -> Tooling:
        return self._tooling

    @property
    def request_tools(self) -> ResponseTools:
        """The tools as the client named them, and the hosted ones."""
        return self._tools

    @property
    def encrypted_reasoning(self) -> bool:
        """Whether reasoning items carry `encrypted_content`."""
        return ENCRYPTED_REASONING in (self.include or ())

    @property
    def messages(self) -> list[llm_pb2.ChatMessage]:
        return self.input.messages  # validated into messages

    @property
    def images(self) -> list[PendingImage]:
        return self.input.images


def generation_input(body: ResponseRequest, history: Sequence[llm_pb2.ChatMessage]) -> GenerationInput:
    """The generation that answers `body`, after the conversation `history`."""
    system = [llm_pb2.ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    effort = body.reasoning.effort if body.reasoning else None
    return GenerationInput(
        model=body.model, messages=[*system, *history, *body.messages], images=body.images, stream=bool(body.stream),
        sampling=SamplingRequest(max_tokens=body.max_output_tokens, temperature=body.temperature, top_p=body.top_p),
        tooling=body.tooling, hosted_tools=body.request_tools.hosted, names=NAMES,
        template_variables={"reasoning_effort": effort} if effort else {},
        affinity=Affinity(body.prompt_cache_key or body.user, body.cache_salt))


@dataclass
class Stored:
    """A stored Response and the conversation that continues from it (without its instructions, which
    OpenAI does not carry over to the next response), as the generation takes it
    (edge/state/conversation.py). An entry in the older, all-JSON form has no conversation here (None): a
    follow-up finds it expired."""

    response: dict[str, Any]
    conversation: list[llm_pb2.ChatMessage] | None

    def encoded(self) -> bytes:
        return conversation.encode(orjson.dumps(self.response), self.conversation or ())

    @classmethod
    def decoded(cls, value: bytes) -> Stored:
        stored = conversation.decode(value)
        if stored is None:
            return cls(orjson.loads(value)["response"], None)
        head, messages = stored
        return cls(orjson.loads(head), messages)


async def stored(store: Space, response_id: str) -> Stored | None:
    value = await store.get(response_id)
    return None if value is None else Stored.decoded(value)


async def history(body: ResponseRequest, store: Space) -> list[llm_pb2.ChatMessage]:
    if body.previous_response_id is None:
        return []
    previous = await stored(store, body.previous_response_id)
    if previous is None or previous.conversation is None:
        raise bad_request(f"Previous response with id '{body.previous_response_id}' not found.",
                          "previous_response_id", "previous_response_not_found")
    return previous.conversation


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", "response_id", "response_not_found")


def encoded(response: dict[str, Any]) -> bytes:
    return orjson.dumps(response)
