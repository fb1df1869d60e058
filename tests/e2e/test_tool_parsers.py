"""Each tool-call parser end to end on its family's real output format: ft-echo behind a chat template that
renders only the last message (tests/templates/echo-tools.jinja) repeats that message token by token
(20 ms apart, so each token is its own chunk), as a model of that family would write its calls."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.support.openai_schema import validate
from tests.support.streams import stream_chunks

TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
ARGS = {"zone": "Europe/Rome", "note": "été"}
CASES = [
    ("ft-echo-hermes",
     "Checking.\n<tool_call>\n" + json.dumps({"name": "get_time", "arguments": ARGS}) + "\n</tool_call>",
     "Checking.\n"),
    ("ft-echo-llama3", json.dumps({"name": "get_time", "parameters": ARGS}), ""),
    ("ft-echo-mistral", "[TOOL_CALLS][" + json.dumps({"name": "get_time", "arguments": ARGS}) + "]", ""),
]


@pytest.mark.parametrize(("model", "output", "content"), CASES, ids=[case[0] for case in CASES])
def test_the_family_output_becomes_tool_calls(http: httpx.Client, model: str, output: str, content: str) -> None:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": output}], "tools": [TOOL]}
    response = http.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    validate(result, "CreateChatCompletionResponse")
    choice = result["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and (choice["message"]["content"] or "") == content
    [call] = choice["message"]["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function" and call["function"]["name"] == "get_time"
    assert json.loads(call["function"]["arguments"]) == ARGS

    chunks = stream_chunks(http, "/v1/chat/completions", {**body, "stream": True})
    for chunk in chunks:
        validate(chunk, "CreateChatCompletionStreamResponse")
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    pieces = [piece for delta in deltas for piece in delta.get("tool_calls") or []]
    assert pieces[0]["id"].startswith("call_") and pieces[0]["function"]["name"] == "get_time"
    assert all("id" not in piece and "name" not in piece["function"] for piece in pieces[1:])
    assert len(pieces) > 3  # the arguments come in pieces, as the tokens come
    assert json.loads("".join(piece["function"]["arguments"] for piece in pieces)) == ARGS
    assert "".join(delta.get("content") or "" for delta in deltas) == content
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
