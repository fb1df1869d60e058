"""POST /v1/responses and GET /v1/responses/{id}: OpenAI's Responses API, served through the chat path.

A Responses request becomes a chat request (`to_chat`): `instructions` the system message, the stored
conversation of `previous_response_id` and then `input` the messages, `text.format` chat's
`response_format`, function `tools` chat's `tools`; so every chat rule and every model-dependent check
applies unchanged. The answer is collected or streamed by the one generation path (edge/streaming.py),
shaped here: `ResponseRecorder.response` for a whole Response, `ResponseEvents` for the stream
(`response.created` ... `response.completed`). A Response with `store` (the default) is kept, with the
conversation that led to it, in the edge's `BoundedStore`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, WithJsonSchema, field_validator

from edge.endpoints.as_chat import validated_chat
from edge.endpoints.chat import ChatCompletionRequest
from edge.endpoints.common import UINT32_MAX, OpenAIRequest, ParamError, ResponseModel
from edge.endpoints.llm_common import Collected, Temperature, TopP
from edge.errors import OpenAIError, bad_request
from edge.store import BoundedStore
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
# Chat's parameters under their Responses names, for the errors of the chat rules.
RESPONSES_PARAM = {"response_format": "text.format", "max_completion_tokens": "max_output_tokens",
                   "messages": "input"}

Message = dict[str, str]  # {"role", "content"}: one chat message
Input = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string", "minLength": 1}, {"type": "array", "minItems": 1,
                                                                                      "items": {"type": "object"}}]})]


def _item_text(content: Any, where: str) -> str:
    """A message item's content: a string, or text parts (joined with newlines)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"'{where}.content' must be a string or an array of content parts", "input")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        else:
            raise ParamError(f"'{where}.content[{j}]': content parts of type {kind!r} are not supported: only "
                             "input_text and output_text", "input")
    return "\n".join(texts)


def input_messages(value: Any) -> list[Message]:
    """`input`: a string (one user message) or message items; any other item type is refused by name."""
    if isinstance(value, str):
        if not value:
            raise ParamError("'input' must not be empty", "input")
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise ParamError("'input' must be a non-empty string or a non-empty array of input items", "input")
    messages = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ParamError(f"'{where}' must be an object (an input item)", "input")
        kind = item.get("type", "message")
        if kind != "message":
            raise ParamError(f"'{where}': input items of type {kind!r} are not supported: only 'message' items",
                             "input")
        role = item.get("role")
        if role not in ROLES:
            raise ParamError(f"'{where}.role' must be one of {', '.join(ROLES)}; got {role!r}", "input")
        messages.append({"role": role, "content": _item_text(item.get("content"), where)})
    return messages


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

    @field_validator("input")
    @classmethod
    def _input(cls, value: Any) -> list[Message]:
        return input_messages(value)

    @property
    def messages(self) -> list[Message]:
        return self.input  # validated into messages


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    """`text.format` as chat's `response_format`."""
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "json_object", "json_schema"):
        raise ParamError("'text.format' must be an object of type text, json_object or json_schema", "text.format")
    if fmt["type"] != "json_schema":
        return {"type": fmt["type"]}
    schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": schema}


def _chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools (Responses' flat shape) as chat's; built-in tools are refused."""
    if not tools:
        return None
    converted = []
    for i, tool in enumerate(tools):
        if tool.get("type") != "function":
            raise ParamError(f"tools of type {tool.get('type')!r} are not supported: only 'function' tools",
                             f"tools[{i}].type")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        converted.append({"type": "function", "function": function})
    return converted


def _chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def to_chat(body: ResponseRequest, history: list[Message]) -> ChatCompletionRequest:
    """The chat request that answers `body`, after the conversation `history`."""
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat = {"model": body.model, "messages": [*system, *history, *body.messages],
            "max_completion_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
            "stream": body.stream, "user": body.user, "response_format": _response_format(body.text),
            "tools": _chat_tools(body.tools), "tool_choice": _chat_tool_choice(body.tool_choice)}
    return validated_chat(chat, RESPONSES_PARAM)


@dataclass
class Stored:
    """A stored Response and the conversation that continues from it (without its instructions, which
    OpenAI does not carry over to the next response)."""

    response: dict[str, Any]
    conversation: list[Message]


def history(body: ResponseRequest, store: BoundedStore[Stored]) -> list[Message]:
    if body.previous_response_id is None:
        return []
    stored = store.get(body.previous_response_id)
    if stored is None:
        raise bad_request(f"Previous response with id '{body.previous_response_id}' not found.",
                          "previous_response_id", "previous_response_not_found")
    return stored.conversation


def not_found(response_id: str) -> OpenAIError:
    return OpenAIError(404, f"Response with id '{response_id}' not found.", "response_id", "response_not_found")


def encoded(response: dict[str, Any]) -> bytes:
    return orjson.dumps(response)


def _usage(usage: common_pb2.Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.total_tokens}


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class ResponseRecorder:
    """Builds the Response of one request (whole, or as stream events with `events`) and stores it."""

    object = "response"
    prefix = "resp"

    def __init__(self, body: ResponseRequest, conversation: list[Message], store: BoundedStore[Stored]) -> None:
        self.body = body
        self.conversation = [*conversation, *body.messages]
        self.store = store
        self.item_id = f"msg_{uuid.uuid4().hex}"

    def snapshot(self, head: dict[str, Any], status: str, output: list[dict[str, Any]],
                 usage: dict[str, Any] | None) -> dict[str, Any]:
        body = self.body
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        snapshot = {"id": head["id"], "object": "response", "created_at": head["created"], "status": status,
                "error": None, "incomplete_details": incomplete, "instructions": body.instructions,
                "max_output_tokens": body.max_output_tokens, "model": head["model"], "output": output,
                "parallel_tool_calls": body.parallel_tool_calls is not False,
                "previous_response_id": body.previous_response_id, "reasoning": None, "store": body.store is not False,
                "temperature": body.temperature, "top_p": body.top_p,
                "text": {"format": (body.text or {}).get("format") or {"type": "text"}},
                "tool_choice": body.tool_choice or "auto", "tools": body.tools or [], "truncation": "disabled",
                "metadata": body.metadata or {}}
        if usage is not None:  # not while in progress
            snapshot["usage"] = usage
        if body.user is not None:
            snapshot["user"] = body.user
        return snapshot

    def message(self, text: str, status: str) -> dict[str, Any]:
        return {"id": self.item_id, "type": "message", "status": status, "role": "assistant",
                "content": [_text_part(text)] if status != "in_progress" else []}

    def finished(self, head: dict[str, Any], text: str, finish_reason: str, usage: common_pb2.Usage
                 ) -> dict[str, Any]:
        """The final Response; stored when asked."""
        status = "incomplete" if finish_reason == "length" else "completed"
        response = self.snapshot(head, status, [self.message(text, status)], _usage(usage))
        response["completed_at"] = int(time.time()) if status == "completed" else None
        if self.body.store is not False:
            conversation = [*self.conversation, {"role": "assistant", "content": text}]
            self.store.put(response["id"], Stored(response, conversation))
        return response

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        """The whole Response (the collecting side of the generation path)."""
        return self.finished(head, choices[0].text, choices[0].finish_reason, usage)

    def events(self, head: dict[str, Any]) -> ResponseEvents:
        return ResponseEvents(self, head)


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class ResponseEvents:
    """The Responses stream: created, in_progress, the message item and its text part opened, a
    text delta per delta, everything closed, then completed (or incomplete) with the usage."""

    def __init__(self, recorder: ResponseRecorder, head: dict[str, Any]) -> None:
        self.recorder = recorder
        self.head = head
        self.sequence = 0
        self.parts: list[str] = []
        self.finish_reason = "stop"

    def _emit(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return _event(payload)

    def _at(self) -> dict[str, Any]:
        return {"item_id": self.recorder.item_id, "output_index": 0, "content_index": 0}

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        opening = self.recorder.snapshot(self.head, "in_progress", [], None)
        yield self._emit("response.created", response=opening)
        yield self._emit("response.in_progress", response=opening)
        yield self._emit("response.output_item.added", output_index=0,
                         item=self.recorder.message("", "in_progress"))
        yield self._emit("response.content_part.added", **self._at(), part=_text_part(""))

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        self.parts.append(delta.text)
        yield self._emit("response.output_text.delta", **self._at(), delta=delta.text, logprobs=[])

    def end(self, index: int, finish_reason: str) -> Iterable[bytes]:
        self.finish_reason = finish_reason
        text = "".join(self.parts)
        status = "incomplete" if finish_reason == "length" else "completed"
        yield self._emit("response.output_text.done", **self._at(), text=text, logprobs=[])
        yield self._emit("response.content_part.done", **self._at(), part=_text_part(text))
        yield self._emit("response.output_item.done", output_index=0, item=self.recorder.message(text, status))

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        response = self.recorder.finished(self.head, "".join(self.parts), self.finish_reason, usage)
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
    output: list[OutputMessage]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: None
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


class ResponseStreamEvent(ResponseModel):
    """One event of a stream (`event:` is its `type`); see OpenAI's ResponseStreamEvent for each type."""

    type: str
    sequence_number: int
