"""The Messages API's beta fields, as Claude Code sends them, on the whole stack through the real anthropic
SDK's beta messages (`client.beta.messages`, with `betas`): system turns, `cache_control`, adaptive thinking
with its display omitted, `output_config.effort`, `context_management`, a JSON `user_id`, Anthropic's client
tools, server tools (hosted, never offered) and deferred tools; and Claude Code's own first request replayed
whole to `/v1/messages?beta=true` with its headers, streamed, for two turns.

`ft-echo-hermes` and `ft-echo-think` repeat the last message as the model's output (tests/templates), so the
message scripts the answer; `scripted-agent` (131,072 tokens of context) answers from a `SCRIPT:` written in
the conversation (tests/triton_models/echo_scripted.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest

from launcher.stack import LocalStack
from tests.support.anthropic_schema import validate_error, validate_event, validate_message
from tests.support.streams import parse_events

ECHO, THINK, AGENT = "ft-echo-hermes", "ft-echo-think", "scripted-agent"
CAPTURE = Path(__file__).parents[1] / "captures" / "claude-code-2.1.328-first-request.json"
CLAUDE_CODE = json.loads(CAPTURE.read_text())  # its method, path, headers and body
BETAS: Any = CLAUDE_CODE["headers"]["anthropic-beta"].split(",")
CACHED: Any = {"cache_control": {"type": "ephemeral"}}
BASH: Any = {"name": "Bash", "description": "Run a shell command.", **CACHED,
             "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}
TOOLS: Any = [BASH, {"type": "bash_20250124", "name": "bash"},
              {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
              {"name": "DeferredToolPlaceholder", "description": "Never call this tool.",
               "input_schema": {"type": "object", "properties": {}}, "defer_loading": True}]
# What Claude Code sends beside its messages and tools.
CLAUDE_FIELDS: Any = {
    "system": [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.328;"},
               {"type": "text", "text": "You are a coding agent.", **CACHED}],
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "high"},
    "metadata": {"user_id": json.dumps({"device_id": "d1", "account_uuid": "", "session_id": "s1"})}}
CALL = '<tool_call>{"name": "Bash", "arguments": {"command": "ls"}}</tool_call>'


@pytest.fixture(scope="module")
def claude(stack: LocalStack) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=stack.edge_url, api_key="unused", max_retries=0, timeout=300)


def turns(last: str) -> list[Any]:
    """Claude Code's shape of a conversation: the user's turn, a system turn, then the message to answer."""
    return [{"role": "user", "content": [{"type": "text", "text": "<system-reminder>Context.</system-reminder>"},
                                         {"type": "text", "text": "List the files.", **CACHED}]},
            {"role": "system", "content": [{"type": "text", "text": "# Environment\nLinux.", **CACHED}]},
            {"role": "user", "content": last}]


def test_beta_create_takes_claude_codes_fields_and_answers_with_a_tool_use(claude: anthropic.Anthropic) -> None:
    message = claude.beta.messages.create(model=ECHO, max_tokens=128, betas=BETAS, messages=turns(CALL),
                                          tools=TOOLS, **CLAUDE_FIELDS)
    assert message.stop_reason == "tool_use"
    [call] = message.content
    assert call.type == "tool_use" and call.name == "Bash" and call.input == {"command": "ls"}
    assert message.context_management is not None and message.context_management.applied_edits == []
    assert message.usage.input_tokens > 0 and message.usage.cache_read_input_tokens == 0  # the echo caches nothing

    answer = claude.beta.messages.create(model=ECHO, max_tokens=128, betas=BETAS, tools=TOOLS, **CLAUDE_FIELDS,
                                         messages=[*turns(CALL), {"role": "assistant", "content": message.content},
                                                   {"role": "user", "content": [{"type": "tool_result",
                                                                                 "tool_use_id": call.id,
                                                                                 "content": "a.txt b.txt", **CACHED}]}])
    assert answer.stop_reason == "end_turn" and [(b.type, getattr(b, "text", "")) for b in answer.content] == [
        ("text", "a.txt b.txt")]


def test_beta_stream_takes_claude_codes_fields(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    with claude.beta.messages.stream(model=ECHO, max_tokens=128, betas=BETAS, messages=turns(CALL), tools=TOOLS,
                                     **CLAUDE_FIELDS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[0].type == "tool_use"
    assert final.content[0].input == {"command": "ls"} and final.context_management is not None

    body = {"model": ECHO, "max_tokens": 128, "stream": True, "messages": turns("Hello."), "tools": TOOLS,
            **CLAUDE_FIELDS}
    with http.stream("POST", "/v1/messages?beta=true", json=body,
                     headers={"anthropic-beta": ",".join(BETAS), "anthropic-version": "2023-06-01"}) as response:
        assert response.status_code == 200, response.read()
        payloads = [json.loads(event.data) for event in parse_events(response.read().decode())]
    for payload in payloads:
        validate_event(payload)
    assert payloads[-2]["type"] == "message_delta" and payloads[-2]["context_management"] == {"applied_edits": []}
    assert "".join(p["delta"].get("text", "") for p in payloads if p["type"] == "content_block_delta") == "Hello."


def test_claude_codes_max_tokens_is_cut_to_a_small_models_room(claude: anthropic.Anthropic, http: httpx.Client) -> None:
    """Claude Code asks 32,000 tokens of every model; `ft-echo` has 256 of context: the Messages API serves the
    request within what the prompt leaves, where chat completions refuse the same `max_tokens`."""
    message = claude.messages.create(model="ft-echo", max_tokens=32000, messages=[{"role": "user", "content": "hi"}])
    assert 0 < message.usage.output_tokens <= 256 - message.usage.input_tokens
    chat = http.post("/v1/chat/completions", json={"model": "ft-echo", "max_tokens": 32000,
                                                   "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "max_tokens"
    with pytest.raises(anthropic.BadRequestError):  # a prompt that leaves no room is still refused
        claude.messages.create(model="ft-echo", max_tokens=32000,
                               messages=[{"role": "user", "content": " hello" * 400}])


def test_anthropics_client_tool_is_called_by_the_name_the_request_gives(claude: anthropic.Anthropic) -> None:
    call = '<tool_call>{"name": "bash", "arguments": {"command": "pwd"}}</tool_call>'
    message = claude.beta.messages.create(model=ECHO, max_tokens=128, betas=BETAS, messages=turns(call),
                                          tools=TOOLS, tool_choice={"type": "auto"})
    assert message.stop_reason == "tool_use" and message.content[0].type == "tool_use"
    assert (message.content[0].name, message.content[0].input) == ("bash", {"command": "pwd"})


@pytest.mark.parametrize("stream", [False, True])
def test_omitted_thinking_has_empty_blocks_and_the_effort_reaches_the_template(claude: anthropic.Anthropic,
                                                                               stream: bool) -> None:
    fields: Any = {"model": THINK, "max_tokens": 128, "betas": BETAS, **CLAUDE_FIELDS,
                   "messages": turns("<think>Plan the listing.</think>Listed.")}
    if stream:
        with claude.beta.messages.stream(**fields) as streamed:
            deltas = [event.delta.type for event in streamed if event.type == "content_block_delta"]
            message = streamed.get_final_message()
        assert "thinking_delta" not in deltas
    else:
        message = claude.beta.messages.create(**fields)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in message.content] == [
        ("thinking", None), ("text", "Listed. (effort: high)")]
    shown = claude.beta.messages.create(**{**fields, "thinking": {"type": "adaptive", "display": "summarized"}})
    assert shown.content[0].type == "thinking" and shown.content[0].thinking == "Plan the listing."


def test_beta_count_tokens_counts_what_create_sends(claude: anthropic.Anthropic) -> None:
    fields: Any = {"model": ECHO, "betas": BETAS, "messages": turns("Count me."), "tools": TOOLS,
                   **{key: value for key, value in CLAUDE_FIELDS.items() if key != "metadata"}}
    counted = claude.beta.messages.count_tokens(**fields)
    created = claude.beta.messages.create(max_tokens=64, **fields)
    assert counted.input_tokens == created.usage.input_tokens + (created.usage.cache_read_input_tokens or 0) > 0


def replay(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """`body` posted as Claude Code posts it (its path and headers); every event checked against Anthropic's
    shapes."""
    with http.stream("POST", CLAUDE_CODE["path"], json=body, headers=CLAUDE_CODE["headers"]) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = [json.loads(event.data) for event in parse_events(response.read().decode())]
    for payload in payloads:
        validate_event(payload)
    assert payloads[0]["type"] == "message_start" and payloads[-1]["type"] == "message_stop"
    return payloads


def test_claude_codes_first_request_is_served_whole(http: httpx.Client) -> None:
    """Its 12 tools, system blocks, system turn, adaptive thinking, context edits, effort and max_tokens 32000:
    200, streamed, on a model with room for it; then, with a script appended, two turns of a tool round trip."""
    body = {**CLAUDE_CODE["body"], "model": AGENT}
    assert body["stream"] is True and body["max_tokens"] == 32000
    payloads = replay(http, body)
    assert payloads[0]["message"]["usage"]["input_tokens"] > 10_000  # an agent's prompt
    text = "".join(p["delta"].get("text", "") for p in payloads if p["type"] == "content_block_delta")
    assert text.startswith("No script")

    script = "SCRIPT:\nSTEP call Bash {\"command\": \"ls\", \"description\": \"List files\"}\nSTEP say Found: {result}"
    asked = [*body["messages"], {"role": "user", "content": script}]
    first = replay(http, {**body, "messages": asked})
    [call] = [p["content_block"] for p in first if p["type"] == "content_block_start"
              and p["content_block"]["type"] == "tool_use"]
    arguments = "".join(p["delta"]["partial_json"] for p in first if p["type"] == "content_block_delta"
                        and p["delta"]["type"] == "input_json_delta")
    assert call["name"] == "Bash" and json.loads(arguments) == {"command": "ls", "description": "List files"}
    assert first[-2]["delta"]["stop_reason"] == "tool_use"
    answered = [*asked, {"role": "assistant", "content": [{**call, "input": json.loads(arguments)}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"],
                                              "content": "README.md\nsrc"}]}]
    second = replay(http, {**body, "messages": answered})
    assert "".join(p["delta"].get("text", "") for p in second if p["type"] == "content_block_delta") == \
        "Found: README.md src"


@pytest.mark.parametrize(("body", "words"), [
    ({"model": ECHO, "messages": turns("hi")}, "max_tokens"),
    ({"model": ECHO, "max_tokens": 16, "messages": turns("hi"), "tools": [{"type": "bash_20250124"}]},
     "tools[0].name"),
    ({"model": ECHO, "max_tokens": 16, "messages": turns("hi"), "tools": TOOLS,
      "tool_choice": {"type": "tool", "name": "web_search"}}, "server tool"),
    ({"model": ECHO, "max_tokens": 16, "messages": turns("hi"), "context_management": {"edits": [
        {"type": "clear_thinking_20251015", "keep": 2}]}}, "context_management.edits[0].keep"),
    ({"model": "no-such-model", "max_tokens": 16, "messages": turns("hi")}, "no-such-model"),
], ids=["pydantic", "tool", "tool_choice", "edit", "model"])
def test_errors_on_the_beta_path_keep_anthropics_shape(http: httpx.Client, body: dict[str, Any], words: str) -> None:
    response = http.post("/v1/messages?beta=true", json=body, headers={"anthropic-beta": ",".join(BETAS)})
    assert response.status_code in (400, 404), response.text
    validate_error(response.json())
    assert words in response.json()["error"]["message"]


def test_a_beta_message_validates_against_anthropics_shapes(http: httpx.Client) -> None:
    response = http.post("/v1/messages?beta=true", json={"model": ECHO, "max_tokens": 64, "messages": turns(CALL),
                                                         "tools": TOOLS, **CLAUDE_FIELDS})
    assert response.status_code == 200, response.text
    validate_message(response.json())
    assert response.json()["context_management"] == {"applied_edits": []}
