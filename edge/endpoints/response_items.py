"""A Response's output items: a `reasoning` item for a reasoning model's thinking (its text as a
`reasoning_text` content part, and with `include: ["reasoning.encrypted_content"]` the same thinking as
`encrypted_content`, edge/endpoints/encrypted_content.py), a `message` item for the text, and per tool
call a `function_call` item (arguments: JSON text) or a `custom_tool_call` item (input: the raw text), named
as the client named the tool (`name`, and `namespace` for a namespace's tool); and the assistant message
that the output is in a stored conversation.
"""

from __future__ import annotations

import uuid
from typing import Any

from edge.endpoints.encrypted_content import encrypted_content
from edge.endpoints.llm_common import Collected
from edge.endpoints.response_tools import Called, ResponseTools, qualified
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2

# Each call item's type, and the field that holds the text the model writes for it.
CALL_TEXT = {"function_call": "arguments", "custom_tool_call": "input"}


def usage_json(usage: common_pb2.Usage) -> dict[str, Any]:
    return {"input_tokens": usage.prompt_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": usage.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
            "total_tokens": usage.total_tokens}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def item_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def status_of(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


def message_item(item: str, text: str, status: str) -> dict[str, Any]:
    return {"id": item, "type": "message", "status": status, "role": "assistant",
            "content": [text_part(text)] if status != "in_progress" else []}


def reasoning_item(item: str, text: str, status: str, encrypted: bool = False) -> dict[str, Any]:
    """A reasoning item; `encrypted`: with the thinking as `encrypted_content` too, once it is whole."""
    if status == "in_progress":
        return {"id": item, "type": "reasoning", "status": status, "summary": [], "content": []}
    sealed = {"encrypted_content": encrypted_content(text)} if encrypted else {}
    return {"id": item, "type": "reasoning", "status": status, "summary": [], "content": [reasoning_part(text)],
            **sealed}


def call_item(call: dict[str, str], status: str, called: Called, item: str = "") -> dict[str, Any]:
    """A call's output item (`call_id` is the id chat gives the call; a new item id unless `item`): a
    `custom_tool_call` for a custom tool (which has no status), else a `function_call`."""
    namespace = {"namespace": called.namespace} if called.namespace else {}
    if called.custom:
        return {"id": item or item_id("ctc"), "type": "custom_tool_call", "call_id": call["id"], "name": called.name,
                "input": call["arguments"], **namespace}
    return {"id": item or item_id("fc"), "type": "function_call", "status": status, "call_id": call["id"],
            "name": called.name, "arguments": call["arguments"], **namespace}


def output_items(choice: Collected, status: str, tools: ResponseTools, encrypted: bool) -> list[dict[str, Any]]:
    """A whole answer's output: the thinking, the message (left out when the answer is only calls or
    thinking, as OpenAI's), then the calls."""
    thinking = [reasoning_item(item_id("rs"), choice.reasoning, status, encrypted)] if choice.reasoning else []
    message = [message_item(item_id("msg"), choice.text, status)] if choice.text or not (
        choice.tool_calls or thinking) else []
    return [*thinking, *message, *(call_item(call, status, tools.called(call["name"])) for call in choice.tool_calls)]


def _past_call(item: dict[str, Any]) -> llm_pb2.ToolCall:
    """A call item as a stored conversation keeps it (a function call without arguments has `{}`)."""
    custom = item["type"] == "custom_tool_call"
    text = item[CALL_TEXT[item["type"]]]
    return llm_pb2.ToolCall(id=item["call_id"], name=qualified(item["name"], item.get("namespace")),
                            arguments=text if text or custom else "{}", custom=custom)


def assistant_message(output: list[dict[str, Any]]) -> llm_pb2.ChatMessage:
    """The output as the chat message that continues a stored conversation: its text, its thinking, and
    its calls under the names the model was offered."""
    text = "".join(part["text"] for item in output if item["type"] == "message" for part in item["content"])
    thinking = "\n".join(part["text"] for item in output if item["type"] == "reasoning" for part in item["content"])
    return llm_pb2.ChatMessage(role="assistant", content=text, reasoning=thinking,
                               tool_calls=[_past_call(item) for item in output if item["type"] in CALL_TEXT])
