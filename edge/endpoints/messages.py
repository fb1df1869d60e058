"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API, on the one generation path,
for the anthropic SDK and Claude Code.

A Messages request becomes the generation input (`generation_input`): `system` the system message, each
turn's content blocks chat messages (`text`; an assistant's `tool_use` blocks its tool calls and its
`thinking` its reasoning; each `tool_result` a tool message answering the `tool_use` of the turn before;
consecutive turns of one role joined into one, as Anthropic does), `tools` ({name, description,
input_schema}) and `tool_choice` (`auto`, `any`, `tool`, `none`) chat's tools under the rules of
edge/endpoints/tools.py, `stop_sequences` the stop strings, `thinking` the chat template's
`enable_thinking`. A refused block names its place (`messages[2].content[0].tool_use_id`), and errors on
these routes have Anthropic's shape (edge/errors.py). The answer is collected (`MessageShape.response`)
or streamed as Anthropic's events (`MessageEvents`): `message_start`, `ping`, per content block
`content_block_start`, its deltas (`thinking_delta`, `text_delta`, `input_json_delta`) and
`content_block_stop`, then `message_delta` (the stop reason and the usage) and `message_stop`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

import orjson
from pydantic import Field, RootModel, WithJsonSchema, field_validator, model_validator

from edge.endpoints.common import UINT32_MAX, OpenAIRequest, ParamError, ResponseModel
from edge.endpoints.generation import GenerationInput, Sampling
from edge.endpoints.images import PendingImage
from edge.endpoints.llm_common import Collected, TopP, stop_list
from edge.endpoints.tools import tool_list
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# The generation's parameters under their Messages names, for what the llm service refuses.
NAMES = {"stop": "stop_sequences", "chat_template_kwargs": "thinking"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
TOOL_CHOICES = ("auto", "any", "tool", "none")
MIN_THINKING_BUDGET = 1024  # Anthropic's least `budget_tokens`

_BLOCK = {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]}
MessagesJson = Annotated[Any, WithJsonSchema({"type": "array", "minItems": 1, "items": {
    "type": "object", "properties": {"role": {"enum": ["user", "assistant"]}, "content": {
        "anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]}}, "required": ["role", "content"]}})]
SystemJson = Annotated[Any, WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _BLOCK}]})]
ToolsJson = Annotated[Any, WithJsonSchema({"type": "array", "items": {
    "type": "object", "properties": {"name": {"type": "string"}, "description": {"type": "string"},
                                     "input_schema": {"type": "object"}}, "required": ["name", "input_schema"]}})]
ToolChoiceJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "type": {"enum": list(TOOL_CHOICES)}, "name": {"type": "string"}, "disable_parallel_tool_use": {"type": "boolean"}},
    "required": ["type"]})]
ThinkingJson = Annotated[Any, WithJsonSchema({"type": "object", "properties": {
    "type": {"enum": ["enabled", "disabled"]}, "budget_tokens": {"type": "integer"}}, "required": ["type"]})]


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    """A turn's content as blocks: a string is one text block."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not content:
        raise ParamError(f"'{where}' must be a string or a non-empty array of content blocks", where)
    for j, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise ParamError(f"'{where}[{j}]' must be an object with a 'type'", f"{where}[{j}]")
    return content


def _string(block: dict[str, Any], field: str, where: str) -> str:
    value = block.get(field)
    if not isinstance(value, str):
        raise ParamError(f"'{where}.{field}' must be a string", f"{where}.{field}")
    return value


def image_url(block: dict[str, Any], where: str) -> tuple[str, str]:
    """An `image` block's picture as a URL for the image loader (edge/endpoints/images.py), with the
    parameter that holds it: its `source`'s base64 `data` (as a `data:` URL) or its `url`."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, dict) else None
    if kind == "base64":
        assert isinstance(source, dict)
        media_type = _string(source, "media_type", f"{where}.source")
        return f"data:{media_type};base64,{_string(source, 'data', f'{where}.source')}", f"{where}.source.data"
    if kind == "url":
        assert isinstance(source, dict)
        return _string(source, "url", f"{where}.source"), f"{where}.source.url"
    raise ParamError(f"'{where}.source' must be an object with type 'base64' (media_type, data) or 'url'",
                     f"{where}.source")


def _tool_result_text(block: dict[str, Any], where: str) -> str:
    """A `tool_result`'s content: a string, or text blocks (joined with newlines)."""
    content = block.get("content", "")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ParamError(f"'{where}.content' must be a string or an array of text blocks", f"{where}.content")
    texts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else None
            raise ParamError(f"'{where}.content[{k}]': blocks of type {kind!r} are not supported in a tool_result: "
                             "only text", f"{where}.content[{k}]")
        texts.append(_string(part, "text", f"{where}.content[{k}]"))
    return "\n".join(texts)


def _user_turn(blocks: list[tuple[dict[str, Any], str]], calls: set[str], pending: list[PendingImage]
               ) -> list[llm_pb2.ChatMessage]:
    """A user turn: a tool message per `tool_result` (answering a `tool_use` of `calls`, the turn before's),
    then the text and images as one user message (its images added to `pending`, loaded later)."""
    messages, texts, images = [], [], []
    for block, where in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "image":
            images.append(image_url(block, where))
        elif kind == "tool_result":
            call_id = _string(block, "tool_use_id", where)
            if call_id not in calls:
                raise ParamError(f"'{where}.tool_use_id': {call_id!r} answers no tool_use block of the previous "
                                 "assistant turn", f"{where}.tool_use_id")
            messages.append(llm_pb2.ChatMessage(role="tool", tool_call_id=call_id,
                                                content=_tool_result_text(block, where)))
        else:
            raise ParamError(f"'{where}.type': blocks of type {kind!r} are not supported in a user turn: only "
                             "text, image and tool_result", f"{where}.type")
    if texts or images:
        messages.append(llm_pb2.ChatMessage(role="user", content="\n".join(texts)))
        pending += [PendingImage(messages[-1], url, param) for url, param in images]
    return messages


def _assistant_turn(blocks: list[tuple[dict[str, Any], str]]) -> llm_pb2.ChatMessage:
    """An assistant turn: its text, its `tool_use` blocks as calls, its `thinking` as the reasoning."""
    message = llm_pb2.ChatMessage(role="assistant")
    texts, thoughts = [], []
    for block, where in blocks:
        kind = block["type"]
        if kind == "text":
            texts.append(_string(block, "text", where))
        elif kind == "thinking":
            thoughts.append(_string(block, "thinking", where))
        elif kind == "redacted_thinking":
            continue  # another model's encrypted thinking: nothing this one can read
        elif kind == "tool_use":
            call_input = block.get("input")
            if not isinstance(call_input, dict):
                raise ParamError(f"'{where}.input' must be an object", f"{where}.input")
            call_id = _string(block, "id", where)
            if not call_id:
                raise ParamError(f"'{where}.id' must not be empty", f"{where}.id")
            message.tool_calls.append(llm_pb2.ToolCall(id=call_id, name=_string(block, "name", where),
                                                       arguments=json.dumps(call_input, ensure_ascii=False)))
        else:
            raise ParamError(f"'{where}.type': blocks of type {kind!r} are not supported in an assistant turn: "
                             "only text, thinking and tool_use", f"{where}.type")
    message.content = "\n".join(texts)
    message.reasoning = "\n".join(thoughts)
    return message


@dataclass(frozen=True)
class Conversation:
    """`messages` as chat messages, and the images of its user turns (loaded before the request goes out)."""

    messages: list[llm_pb2.ChatMessage]
    images: list[PendingImage]


def chat_messages(value: Any) -> Conversation:
    """`messages`: user and assistant turns, consecutive turns of one role joined (as Anthropic does)."""
    if not isinstance(value, list) or not value:
        raise ParamError("'messages' must be a non-empty array of turns", "messages")
    turns: list[tuple[str, list[tuple[dict[str, Any], str]]]] = []
    for i, turn in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(turn, dict):
            raise ParamError(f"'{where}' must be an object with 'role' and 'content'", where)
        role = turn.get("role")
        if role not in ("user", "assistant"):
            raise ParamError(f"'{where}.role' must be 'user' or 'assistant'; got {role!r} (the system prompt is "
                             "the top-level 'system')", f"{where}.role")
        blocks = [(block, f"{where}.content[{j}]") for j, block in
                  enumerate(_blocks(turn.get("content"), f"{where}.content"))]
        if isinstance(turn.get("content"), str):
            blocks = [(blocks[0][0], f"{where}.content")]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    messages: list[llm_pb2.ChatMessage] = []
    images: list[PendingImage] = []
    calls: set[str] = set()  # the ids of the previous assistant turn's tool_use blocks
    for role, blocks in turns:
        if role == "user":
            messages += _user_turn(blocks, calls, images)
        else:
            messages.append(_assistant_turn(blocks))
            calls = {call.id for call in messages[-1].tool_calls}
    return Conversation(messages, images)


def system_text(value: Any) -> str:
    """`system`: a string, or text blocks (joined with newlines)."""
    if isinstance(value, str):
        return value
    blocks = _blocks(value, "system")
    for j, block in enumerate(blocks):
        if block["type"] != "text":
            raise ParamError(f"'system[{j}].type': only text blocks are allowed in 'system'", f"system[{j}].type")
    return "\n".join(_string(block, "text", f"system[{j}]") for j, block in enumerate(blocks))


def tool_choice(value: Any, tools: list[llm_pb2.Tool]) -> tuple[llm_pb2.ToolChoice, bool | None]:
    """`tool_choice` ({type: auto | any | tool (with `name`) | none, disable_parallel_tool_use}) as chat's
    choice, and whether calls may be parallel (None: the default)."""
    if value is None:
        return llm_pb2.ToolChoice(mode="auto" if tools else "none"), None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in TOOL_CHOICES:
        raise ParamError("'tool_choice' must be an object with type 'auto', 'any', 'tool' or 'none'", "tool_choice")
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise ParamError("'tool_choice.disable_parallel_tool_use' must be a boolean",
                         "tool_choice.disable_parallel_tool_use")
    parallel = None if parallel is None else not parallel
    if kind in ("any", "tool") and not tools:
        raise ParamError(f"'tool_choice' of type {kind!r} needs 'tools'", "tool_choice")
    if kind == "tool":
        name = value.get("name")
        if name not in {tool.name for tool in tools}:
            raise ParamError(f"'tool_choice.name' names the tool {name!r}, which is not in 'tools'", "tool_choice.name")
        return llm_pb2.ToolChoice(mode="function", function=name), parallel
    return llm_pb2.ToolChoice(mode="required" if kind == "any" else str(kind)), parallel


def thinking_switch(value: Any) -> bool | None:
    """`thinking` ({type: enabled, budget_tokens} or {type: disabled}) as the template's `enable_thinking`."""
    if value is None:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "disabled":
        return False
    if kind != "enabled":
        raise ParamError("'thinking' must be an object with type 'enabled' (and 'budget_tokens') or 'disabled'",
                         "thinking")
    budget = value.get("budget_tokens")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < MIN_THINKING_BUDGET:
        raise ParamError(f"'thinking.budget_tokens' must be an integer of at least {MIN_THINKING_BUDGET}",
                         "thinking.budget_tokens")
    return True


class Metadata(OpenAIRequest):
    user_id: str | None = None


class MessagesInput(OpenAIRequest):
    """What a generation and a token count share: the model, the conversation, the tools, thinking."""

    model: str
    messages: MessagesJson
    system: SystemJson = None
    tools: ToolsJson = None
    tool_choice: ToolChoiceJson = None
    thinking: ThinkingJson = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: Any) -> Conversation:
        return chat_messages(value)

    @field_validator("system")
    @classmethod
    def _system(cls, value: Any) -> str | None:
        return None if value is None else system_text(value)

    @field_validator("thinking")
    @classmethod
    def _thinking(cls, value: Any) -> Any:
        thinking_switch(value)
        return value


class MessagesRequest(MessagesInput):
    """Anthropic's CreateMessage (what this server reads of it; the rest is ignored, as elsewhere)."""

    max_tokens: Annotated[int, Field(ge=1, le=UINT32_MAX)]
    stop_sequences: Annotated[Any, WithJsonSchema({"type": "array", "items": {"type": "string"}})] = None
    temperature: Annotated[float, Field(ge=0, le=1)] | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Field(ge=0, le=UINT32_MAX)] | None = None
    stream: bool | None = False
    metadata: Metadata | None = None

    @field_validator("stop_sequences")
    @classmethod
    def _stop_sequences(cls, value: Any) -> list[str] | None:
        if value is not None and not isinstance(value, list):
            raise ParamError("'stop_sequences' must be an array of strings", "stop_sequences")
        return None if value is None else stop_list(value, "stop_sequences")

    @model_validator(mode="after")
    def _budget(self) -> Self:
        if thinking_switch(self.thinking) and self.thinking["budget_tokens"] >= self.max_tokens:
            raise ParamError("'thinking.budget_tokens' must be less than 'max_tokens'", "thinking.budget_tokens")
        return self


def generation_input(body: MessagesInput) -> GenerationInput:
    """The generation that answers `body` (a token count: the same input, never sent to generate)."""
    tools = tool_list(body.tools, "tools", "anthropic") if body.tools is not None else []
    choice, parallel = tool_choice(body.tool_choice, tools)
    system = [llm_pb2.ChatMessage(role="system", content=body.system)] if body.system else []
    thinking = thinking_switch(body.thinking)
    sampling = Sampling()
    stream = False
    if isinstance(body, MessagesRequest):
        sampling = Sampling(max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p,
                            top_k=body.top_k, stop=body.stop_sequences or ())
        stream = bool(body.stream)
    conversation: Conversation = body.messages
    return GenerationInput(model=body.model, messages=[*system, *conversation.messages], images=conversation.images,
                           sampling=sampling, stream=stream,
                           tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                           template_variables={} if thinking is None else {"enable_thinking": thinking}, names=NAMES)


def _stop(finish_reason: str, stop_string: str) -> dict[str, Any]:
    if stop_string:
        return {"stop_reason": "stop_sequence", "stop_sequence": stop_string}
    return {"stop_reason": STOP_REASONS.get(finish_reason, "end_turn"), "stop_sequence": None}


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0}


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as the `input` object (a model that wrote no JSON object gives {})."""
    try:
        value = json.loads(text or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _event(payload: dict[str, Any]) -> bytes:
    return b"event: " + payload["type"].encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def thinking_block(text: str) -> dict[str, Any]:
    return {"type": "thinking", "thinking": text, "signature": ""}  # no signature: nothing here is signed


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def tool_use_block(call_id: str, name: str, call_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": call_input}


class MessageShape:
    """A whole Message (the collecting side of the generation path), and its stream (`events`)."""

    object = "message"
    prefix = "msg_"  # Anthropic's ids: msg_...

    def message(self, head: dict[str, Any], content: list[dict[str, Any]], stop: dict[str, Any],
                usage: dict[str, int]) -> dict[str, Any]:
        return {"id": head["id"], "type": "message", "role": "assistant", "model": head["model"], "content": content,
                **stop, "usage": usage}

    def response(self, head: dict[str, Any], choices: list[Collected], usage: common_pb2.Usage) -> dict[str, Any]:
        choice = choices[0]
        content = [thinking_block(choice.reasoning)] if choice.reasoning else []
        if choice.text:
            content.append(text_block(choice.text))
        content += [tool_use_block(call["id"], call["name"], _arguments(call["arguments"]))
                    for call in choice.tool_calls]
        return self.message(head, content, _stop(choice.finish_reason, choice.stop_string),
                            _usage(usage.prompt_tokens, usage.completion_tokens))

    def events(self, head: dict[str, Any]) -> MessageEvents:
        return MessageEvents(self, head)


class MessageEvents:
    """Anthropic's stream: message_start and a ping; each content block opened (content_block_start) with
    the first piece of its kind (thinking, text, or a new tool call), its deltas, closed
    (content_block_stop) when another begins or the answer ends; then message_delta and message_stop."""

    def __init__(self, shape: MessageShape, head: dict[str, Any]) -> None:
        self.shape = shape
        self.head = head
        self.blocks = 0  # blocks opened so far; the last is open while `open` is set
        self.open: str | None = None  # "thinking", "text", or the index of the tool call being streamed
        self.stop: dict[str, Any] = _stop("stop", "")
        self.input_tokens = 0

    def _close(self) -> Iterator[bytes]:
        if self.open is not None:
            yield _event({"type": "content_block_stop", "index": self.blocks - 1})
            self.open = None

    def _block(self, kind: str, block: dict[str, Any]) -> Iterator[bytes]:
        """Open a block of `kind` unless one is open."""
        if self.open != kind:
            yield from self._close()
            yield _event({"type": "content_block_start", "index": self.blocks, "content_block": block})
            self.blocks += 1
            self.open = kind

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event({"type": "content_block_delta", "index": self.blocks - 1, "delta": delta})

    def start(self, accepted: llm_pb2.Accepted) -> Iterable[bytes]:
        self.input_tokens = accepted.prompt_tokens
        message = self.shape.message(self.head, [], {"stop_reason": None, "stop_sequence": None},
                                     _usage(accepted.prompt_tokens, 0))
        yield _event({"type": "message_start", "message": message})
        yield _event({"type": "ping"})

    def delta(self, delta: llm_pb2.Delta) -> Iterable[bytes]:
        if delta.reasoning:
            yield from self._block("thinking", thinking_block(""))
            yield self._delta({"type": "thinking_delta", "thinking": delta.reasoning})
        if delta.text:
            yield from self._block("text", text_block(""))
            yield self._delta({"type": "text_delta", "text": delta.text})
        for piece in delta.tool_calls:
            yield from self._block(f"call {piece.index}", tool_use_block(piece.id, piece.name, {}))
            if piece.arguments:
                yield self._delta({"type": "input_json_delta", "partial_json": piece.arguments})

    def end(self, index: int, finish_reason: str, stop_string: str = "") -> Iterable[bytes]:
        self.stop = _stop(finish_reason, stop_string)
        yield from self._close()

    def finish(self, usage: common_pb2.Usage) -> Iterable[bytes]:
        yield _event({"type": "message_delta", "delta": self.stop,
                      "usage": _usage(usage.prompt_tokens, usage.completion_tokens)})
        yield _event({"type": "message_stop"})


class CountTokensRequest(MessagesInput):
    """Anthropic's CountMessageTokens: the input of a Messages request, counted as it would be sent."""


def token_count(tokens: int) -> dict[str, int]:
    return {"input_tokens": tokens}


# The schemas /openapi.json declares (Anthropic's, restricted to what this server sends).
class TextBlock(ResponseModel):
    type: Literal["text"]
    text: str


class ThinkingBlock(ResponseModel):
    type: Literal["thinking"]
    thinking: str
    signature: str


class ToolUseBlock(ResponseModel):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = Annotated[TextBlock | ThinkingBlock | ToolUseBlock, Field(discriminator="type")]


class MessageUsage(ResponseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int


class Message(ResponseModel):
    id: str
    type: Literal["message"]
    role: Literal["assistant"]
    model: str
    content: list[ContentBlock]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None
    usage: MessageUsage


class MessageStartEvent(ResponseModel):
    type: Literal["message_start"]
    message: Message


class PingEvent(ResponseModel):
    type: Literal["ping"]


class ContentBlockStartEvent(ResponseModel):
    type: Literal["content_block_start"]
    index: int
    content_block: ContentBlock


class TextDelta(ResponseModel):
    type: Literal["text_delta"]
    text: str


class ThinkingDelta(ResponseModel):
    type: Literal["thinking_delta"]
    thinking: str


class InputJsonDelta(ResponseModel):
    type: Literal["input_json_delta"]
    partial_json: str


class ContentBlockDeltaEvent(ResponseModel):
    type: Literal["content_block_delta"]
    index: int
    delta: Annotated[TextDelta | ThinkingDelta | InputJsonDelta, Field(discriminator="type")]


class ContentBlockStopEvent(ResponseModel):
    type: Literal["content_block_stop"]
    index: int


class StopDelta(ResponseModel):
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]
    stop_sequence: str | None


class MessageDeltaEvent(ResponseModel):
    type: Literal["message_delta"]
    delta: StopDelta
    usage: MessageUsage


class MessageStopEvent(ResponseModel):
    type: Literal["message_stop"]


class MessageStreamEvent(RootModel[Annotated[
        MessageStartEvent | PingEvent | ContentBlockStartEvent | ContentBlockDeltaEvent | ContentBlockStopEvent
        | MessageDeltaEvent | MessageStopEvent, Field(discriminator="type")]]):
    """One event of a stream (`event:` is its `type`)."""


class TokenCount(ResponseModel):
    input_tokens: int


class AnthropicErrorObject(ResponseModel):
    type: str
    message: str


class AnthropicError(ResponseModel):
    """Anthropic's error body, which every error of these routes has."""

    type: Literal["error"]
    error: AnthropicErrorObject
