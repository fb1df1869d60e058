"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API, on the one generation path.

A Responses request becomes the generation input (`generation_input`): `instructions` the system
message, the stored conversation of `previous_response_id` and then `input` the messages
(edge/endpoints/response_input.py, function calls and their outputs included), `text.format` the output
format and function `tools` the tools, through the rules chat uses for its own (edge/endpoints/tools.py),
with errors naming this request's parameters. The answer is collected or streamed by the one generation
path (edge/streaming.py), shaped here: a `message` output item for the text and a `function_call` item
per tool call, before them a `reasoning` item for a reasoning model's thinking (its text as a
`reasoning_text` content part; `reasoning.effort` reaches the chat template as `reasoning_effort`, as
chat's does), `ResponseRecorder.response` for a whole Response, `ResponseEvents` for the stream
(`response.created` ... `response.completed`). A Response with `store` (the default) is kept, with the
conversation that led to it, in the state store that every edge process shares (edge/state/).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, RootModel, WithJsonSchema, field_validator

from edge.endpoints.chat import ReasoningEffort
from edge.endpoints.common import UINT32_MAX, OpenAIRequest, ResponseModel
from edge.endpoints.generation import GenerationInput, Sampling
from edge.endpoints.images import PendingImage
from edge.endpoints.llm_common import Collected, Temperature, TopP
from edge.endpoints.response_input import InputMessages, Message, chat_json, from_chat_json, input_messages
from edge.endpoints.tools import response_guide, tool_choice, tool_list
from edge.errors import OpenAIError, bad_request
from edge.state import Space
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under their Responses names, for what the llm service refuses.
NAMES = {"response_format": "text.format", "max_tokens": "max_output_tokens", "messages": "input"}

Input = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1,
                                                                                      "items": {"type": "object"}}]})]


class ReasoningOptions(OpenAIRequest):
    """OpenAI's `reasoning`: `effort` reaches the chat template; no summaries are written."""

    effort: ReasoningEffort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None


class ResponseRequest(OpenAIRequest):
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
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | "json_schema", ...}}
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: ReasoningOptions | None = None

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> InputMessages:
        return input_messages(value)

    @property
    def messages(self) -> list[llm_pb2.ChatMessage]:
        return self.input.messages  # validated into messages

    @property
    def images(self) -> list[PendingImage]:
        return self.input.images


def _echoed_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A function tool as a Response lists it: `parameters` and `strict` always there (null when not given)."""
    return {"parameters": None, "strict": None, **tool}


def generation_input(body: ResponseRequest, history: Sequence[llm_pb2.ChatMessage]) -> GenerationInput:
    """The generation that answers `body`, after the conversation `history`."""
    system = [llm_pb2.ChatMessage(role="system", content=body.instructions)] if body.instructions else []
    tools = tool_list(body.tools, "tools", "flat") if body.tools else []
    return GenerationInput(
        model=body.model, messages=[*system, *history, *body.messages], images=body.images, stream=bool(body.stream),
        sampling=Sampling(max_tokens=body.max_output_tokens, temperature=body.temperature, top_p=body.top_p),
        tools=tools, tool_choice=tool_choice(body.tool_choice, tools, "tool_choice", "flat"),
        parallel_tool_calls=body.parallel_tool_calls,
        guide=response_guide((body.text or {}).get("format"), "text.format", nested=None), names=NAMES,
        template_variables={"reasoning_effort": body.reasoning.effort} if body.reasoning and body.reasoning.effort
        else {})


@dataclass
class Stored:
    """A stored Response and the conversation that continues from it (without its instructions, which
    OpenAI does not carry over to the next response)."""

    response: dict[str, Any]
    conversation: list[Message]

    def encoded(self) -> bytes:
        return orjson.dumps({"response": self.response, "conversation": self.conversation})

    @classmethod
    def decoded(cls, value: bytes) -> Stored:
        fields = orjson.loads(value)
        return cls(fields["response"], fields["conversation"])


async def stored(store: Space, response_id: str) -> Stored | None:
    value = await store.get(response_id)
    return None if value is None else Stored.decoded(value)


async def history(body: ResponseRequest, store: Space) -> list[llm_pb2.ChatMessage]:
    if body.previous_response_id is None:
        return []
    previous = await stored(store, body.previous_response_id)
    if previous is None:
        raise bad_request(f"Previous response with id '{body.previous_response_id}' not found.",
                          "previous_response_id", "previous_response_not_found")
    return [from_chat_json(message) for message in previous.conversation]


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", "response_id", "response_not_found")


def encoded(response: dict[str, Any]) -> bytes:
    return orjson.dumps(response)


def _usage(usage: common_pb2.Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total_tokens}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "message", "status": status, "role": "assistant",
            "content": [_text_part(text)] if status != "in_progress" else []}


def reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "reasoning", "status": status, "summary": [],
            "content": [_reasoning_part(text)] if status != "in_progress" else []}


def call_item(item_id: str, call: dict[str, str], status: str) -> dict[str, Any]:
    """A `function_call` output item: `call_id` is the id chat gives the call."""
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call["id"], "name": call["name"],
            "arguments": call["arguments"]}


def output_items(choice: Collected, status: str) -> list[dict[str, Any]]:
    """A whole answer's output: the thinking, the message (left out when the answer is only calls or
    thinking, as OpenAI's), then the calls."""
    thinking = [reasoning_item(_item_id("rs"), choice.reasoning, status)] if choice.reasoning else []
    message = [message_item(_item_id("msg"), choice.text, status)] if choice.text or not (
        choice.tool_calls or thinking) else []
    return [*thinking, *message, *(call_item(_item_id("fc"), call, status) for call in choice.tool_calls)]


def assistant_message(output: list[dict[str, Any]]) -> Message:
    """The output as the chat message that continues a stored conversation."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    calls = [{"id": item["call_id"], "type": "function", "function": {"name": item["name"],
                                                                      "arguments": item["arguments"]}}
             for item in output if item["type"] == "function_call"]
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": text or None, "tool_calls": calls}


class ResponseRecorder:
    """Builds the Response of one request (whole, or as stream events with `events`) and stores it
    (`persist`, before the client sees it finished)."""

    object = "response"
    prefix = "resp-"

    def __init__(self, body: ResponseRequest, history: Sequence[llm_pb2.ChatMessage], store: Space) -> None:
        self.body = body
        self.conversation = [*history, *body.messages]
        self.store = store
        self.finished_response: Stored | None = None  # to store, once finished

    def snapshot(self, head: dict[str, Any], status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        snapshot = {"id": head["id"], "object": "response", "created_at": head["created"], "status": status,
                "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
                "max_output_tokens": body.max_output_tokens, "model": head["model"], "output": output,
                "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": body.previous_response_id,
                "reasoning": body.reasoning.model_dump() if body.reasoning else None, "store": body.store is not False,
                "temperature": body.temperature, "top_p": body.top_p,
                "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
                "tool_choice": body.tool_choice or "auto", "tools": [_echoed_tool(tool) for tool in body.tools or []],
                "truncation": "disabled", "metadata": body.metadata or {}}
        if usage is not None:  # not while in progress
            snapshot["usage"] = usage
        if body.user is not None:
            snapshot["user"] = body.user
        return snapshot

    def finished(self, head: dict[str, Any], output: list[dict[str, Any]], finish_reason: str,
                 usage: common_pb2.Usage) -> dict[str, Any]:
        """The final Response; stored when asked."""
        status = _status(finish_reason)
        response = self.snapshot(head, status, output, _usage(usage))
        response["completed_at"] = int(time.time()) if status == "completed" else None
        if self.body.store is not False:
            self.finished_response = Stored(response, [*map(chat_json, self.conversation), assistant_message(output)])
        return response

    async def persist(self) -> None:
        if self.finished_response is not None:
            await self.store.put(self.finished_response.response["id"], self.finished_response.encoded())

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        """The whole Response (the collecting side of the generation path)."""
        choice = choices[0]
        output = output_items(choice, _status(choice.finish_reason))
        return self.finished(head, output, choice.finish_reason, usage)

    def events(self, head: dict[str, Any]) -> ResponseEvents:
        return ResponseEvents(self, head)


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponseEvents:
    """The Responses stream: created and in_progress; then each output item in turn, opened (added), its
    text deltas (a message's or a reasoning item's) or arguments deltas (a function call's), closed (done);
    then completed (or
    incomplete) with the usage. A message item opens with the first text, a function_call item with the
    first piece of a call; an answer with neither is one empty message."""

    def __init__(self, recorder: ResponseRecorder, head: dict[str, Any]) -> None:
        self.recorder = recorder
        self.head = head
        self.sequence = 0
        self.items: list[dict[str, Any]] = []  # output items so far; the last is open while `current` is set
        self.current: dict[str, Any] | None = None
        self.call_index = -1  # the chat index of the call being streamed
        self.parts: list[str] = []  # the open message's text
        self.finish_reason = "stop"

    def _emit(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _event(payload)

    def _at(self) -> dict[str, Any]:
        """Where an event of the open item points."""
        assert self.current is not None
        return {"item_id": self.current["id"], "output_index": len(self.items) - 1}

    def _open(self, item: dict[str, Any]) -> Iterable[bytes]:
        self.current = item
        self.items.append(item)
        yield self._emit("response.output_item.added", output_index=len(self.items) - 1, item=item)
        if item["type"] in ("message", "reasoning"):
            self.parts = []
            part = _text_part("") if item["type"] == "message" else _reasoning_part("")
            yield self._emit("response.content_part.added", **self._at(), content_index=0, part=part)

    def _close(self, status: str) -> Iterable[bytes]:
        item = self.current
        if item is None:
            return
        if item["type"] == "message":
            text = "".join(self.parts)
            yield self._emit("response.output_text.done", **self._at(), content_index=0, text=text, logprobs=[])
            yield self._emit("response.content_part.done", **self._at(), content_index=0, part=_text_part(text))
            done = message_item(item["id"], text, status)
        elif item["type"] == "reasoning":
            text = "".join(self.parts)
            yield self._emit("response.reasoning_text.done", **self._at(), content_index=0, text=text)
            yield self._emit("response.content_part.done", **self._at(), content_index=0, part=_reasoning_part(text))
            done = reasoning_item(item["id"], text, status)
        else:
            yield self._emit("response.function_call_arguments.done", **self._at(), name=item["name"],
                             arguments=item["arguments"])
            done = {**item, "status": status}
        self.items[-1] = done
        self.current = None
        yield self._emit("response.output_item.done", output_index=len(self.items) - 1, item=done)

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        opening = self.recorder.snapshot(self.head, "in_progress", [], None)
        yield self._emit("response.created", response=opening)
        yield self._emit("response.in_progress", response=opening)

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if delta.reasoning:
            if self.current is None or self.current["type"] != "reasoning":
                yield from self._close("completed")
                yield from self._open(reasoning_item(_item_id("rs"), "", "in_progress"))
            self.parts.append(delta.reasoning)
            yield self._emit("response.reasoning_text.delta", **self._at(), content_index=0, delta=delta.reasoning)
        if delta.text:
            if self.current is None or self.current["type"] != "message":
                yield from self._close("completed")
                yield from self._open(message_item(_item_id("msg"), "", "in_progress"))
            self.parts.append(delta.text)
            yield self._emit("response.output_text.delta", **self._at(), content_index=0, delta=delta.text,
                             logprobs=[])
        for piece in delta.tool_calls:
            if self.current is None or self.current["type"] != "function_call" or piece.index != self.call_index:
                yield from self._close("completed")
                self.call_index = piece.index
                call = {"id": piece.id, "name": piece.name, "arguments": ""}
                yield from self._open(call_item(_item_id("fc"), call, "in_progress"))
            if piece.arguments:
                assert self.current is not None
                self.current = {**self.current, "arguments": self.current["arguments"] + piece.arguments}
                self.items[-1] = self.current
                yield self._emit("response.function_call_arguments.delta", **self._at(), delta=piece.arguments)

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.finish_reason = finish_reason
        if not self.items:
            yield from self._open(message_item(_item_id("msg"), "", "in_progress"))
        yield from self._close(_status(finish_reason))

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        response = self.recorder.finished(self.head, self.items, self.finish_reason, usage)
        kind = "response.completed" if response["status"] == "completed" else "response.incomplete"
        yield self._emit(kind, response=response)


# The schemas /openapi.json declares (OpenAI's Response and ResponseStreamEvent, restricted to what this
# server sends).
class OutputText(ResponseModel):
    type: Literal["output_text"]
    text: str
    annotations: list[Any]
    logprobs: list[Any]


class OutputMessage(ResponseModel):
    id: str
    type: Literal["message"]
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"]
    content: list[OutputText]


class ReasoningText(ResponseModel):
    type: Literal["reasoning_text"]
    text: str


class ReasoningItem(ResponseModel):
    id: str
    type: Literal["reasoning"]
    status: Literal["in_progress", "completed", "incomplete"]
    summary: list[Any]  # always empty: no summaries are written
    content: list[ReasoningText]


class ReasoningConfig(ResponseModel):
    effort: ReasoningEffort | None
    summary: Literal["auto", "concise", "detailed"] | None


class FunctionCallItem(ResponseModel):
    id: str
    type: Literal["function_call"]
    status: Literal["in_progress", "completed", "incomplete"]
    call_id: str
    name: str
    arguments: str


class ResponseUsage(ResponseModel):
    input_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens: int
    output_tokens_details: dict[str, int]
    total_tokens: int


class Response(ResponseModel):
    id: str
    object: Literal["response"]
    created_at: int
    completed_at: int | None = None
    status: Literal["completed", "incomplete", "in_progress"]
    error: None
    incomplete_details: dict[str, str] | None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[ReasoningItem | OutputMessage | FunctionCallItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig | None
    store: bool
    temperature: float | None
    top_p: float | None
    text: dict[str, Any]
    tool_choice: Any
    tools: list[Any]
    truncation: Literal["disabled"]
    usage: ResponseUsage | None = None
    user: str | None = None
    metadata: dict[str, str]


class _Event(ResponseModel):
    sequence_number: int


class ResponseLifecycleEvent(_Event):
    type: Literal["response.created", "response.in_progress", "response.completed", "response.incomplete"]
    response: Response


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: ReasoningItem | OutputMessage | FunctionCallItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int
    part: OutputText | ReasoningText


class ReasoningTextDeltaEvent(_Event):
    type: Literal["response.reasoning_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str


class ReasoningTextDoneEvent(_Event):
    type: Literal["response.reasoning_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str


class OutputTextDeltaEvent(_Event):
    type: Literal["response.output_text.delta"]
    item_id: str
    output_index: int
    content_index: int
    delta: str
    logprobs: list[Any]


class OutputTextDoneEvent(_Event):
    type: Literal["response.output_text.done"]
    item_id: str
    output_index: int
    content_index: int
    text: str
    logprobs: list[Any]


class ArgumentsDeltaEvent(_Event):
    type: Literal["response.function_call_arguments.delta"]
    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(_Event):
    type: Literal["response.function_call_arguments.done"]
    item_id: str
    output_index: int
    name: str
    arguments: str


class ResponseStreamEvent(RootModel[Annotated[
        ResponseLifecycleEvent | OutputItemEvent | ContentPartEvent | OutputTextDeltaEvent | OutputTextDoneEvent
        | ArgumentsDeltaEvent | ArgumentsDoneEvent | ReasoningTextDeltaEvent | ReasoningTextDoneEvent,
        Field(discriminator="type")]]):
    """One event of a stream (`event:` is its `type`): the types of OpenAI's ResponseStreamEvent that
    `ResponseEvents` writes."""
