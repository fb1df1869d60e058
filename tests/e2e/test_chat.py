"""/v1/chat/completions end to end: the openai SDK and raw HTTP → edge → llm service → real Triton.

SmolLM2 answers for real (few, short requests: it runs on this CPU); the echo models, one per Triton LLM
interface (the `backend` fixture, tests.support.backends), whose continuation repeats the prompt
SmolLM2's chat template made, give exact text and chunks.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from launcher.stack import DEMO_LLMS
from tests.support.backends import EchoBackend
from tests.support.openai_schema import validate
from tests.support.streams import stream_chunks, stream_events

SMOLLM2 = "smollm2-135m-instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
# What an echo model answers to any conversation without a system message: SmolLM2's template adds its default
# system message first, and the echo ends at that message's <|im_end|>, the end id.
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}
FT_ECHO = "ft-echo"  # the tests of one interface's behaviour, or of what only a template shows
DEFAULT_SYSTEM = "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chat(http: httpx.Client, model: str, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                                                       **body})
    assert response.status_code == 200, response.text
    result = response.json()
    validate(result, "CreateChatCompletionResponse")
    assert "system_fingerprint" not in result
    return result


def chunks(http: httpx.Client, model: str, **body: Any) -> list[dict[str, Any]]:
    result = stream_chunks(http, "/v1/chat/completions", {
        "model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True, **body})
    for chunk in result:
        validate(chunk, "CreateChatCompletionStreamResponse")
        assert chunk["object"] == "chat.completion.chunk" and chunk["id"] == result[0]["id"]
        assert chunk["id"].startswith("chatcmpl-") and "system_fingerprint" not in chunk
    return result


@pytest.mark.parametrize("model", DEMO_LLMS.values())
def test_smollm2_knows_the_capital_of_france(client: openai.OpenAI, model: str) -> None:
    """The demo LLM behind each Triton LLM interface (FasterTransformer, TensorRT-LLM, its ensemble, vLLM)."""
    answers = [client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=12)
               for _ in range(2)]
    for answer in answers:
        assert "Paris" in (answer.choices[0].message.content or "")
        assert answer.choices[0].message.role == "assistant" and answer.usage is not None
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content  # temperature 0
    stream = client.chat.completions.create(model=model, messages=FRANCE, temperature=0, max_tokens=12,
                                            stream=True)
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "Paris" in streamed


def test_a_seed_makes_sampling_repeatable(client: openai.OpenAI) -> None:
    def sample() -> str:
        answer = client.chat.completions.create(model=SMOLLM2, messages=[{"role": "user", "content": "Tell a story."}],
                                                temperature=1.0, top_p=1.0, seed=1234, max_tokens=10)
        return answer.choices[0].message.content or ""

    first = sample()
    assert first and sample() == first


def test_exact_chunks_role_first_then_content_then_the_reason(http: httpx.Client, backend: EchoBackend) -> None:
    result = chunks(http, backend.model)
    assert result[0]["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                     "finish_reason": None}]
    assert all(c["choices"][0]["finish_reason"] is None for c in result[:-1])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in result) == DEFAULT_SYSTEM
    assert result[-1]["choices"] == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]
    whole = chat(http, backend.model)
    assert whole["object"] == "chat.completion" and whole["id"].startswith("chatcmpl-")
    assert whole["choices"] == [{"index": 0, "message": {"role": "assistant", "content": DEFAULT_SYSTEM,
                                                         "refusal": None},
                                 "logprobs": None, "finish_reason": "stop"}]
    # 19 tokens of text and the end id, which TensorRT-LLM leaves out of its output and counts.
    assert whole["usage"]["completion_tokens"] == (20 if backend.counts_end_token else 19)


def test_system_message_and_text_parts(http: httpx.Client, backend: EchoBackend) -> None:
    parts = [{"type": "text", "text": "Answer"}, {"type": "text", "text": "briefly."}]
    messages = [{"role": "system", "content": parts}, {"role": "user", "content": "hi"}]
    answer = chat(http, backend.model, messages=messages)["choices"][0]["message"]["content"]
    assert answer == "system\nAnswer\nbriefly."


def test_stop_length_and_n(http: httpx.Client, backend: EchoBackend) -> None:
    # Paced: the stop's cancellation reaches the model mid-generation, not as it ends (see test_completions.ROOM).
    stopped = chat(http, backend.slow, stop=" helpful")["choices"][0]
    assert stopped["message"]["content"] == "system\nYou are a" and stopped["finish_reason"] == "stop"
    cut = chat(http, backend.model, max_tokens=3)["choices"][0]  # the first token is the skipped <|im_start|>
    assert cut["message"]["content"] == "system\n" and cut["finish_reason"] == "length"
    result = chunks(http, backend.model, n=2, max_tokens=3)
    assert [c["choices"][0]["delta"] for c in result[:2]] == [{"role": "assistant", "content": ""}] * 2
    assert [c["choices"][0]["index"] for c in result[:2]] == [0, 1]
    ends = [c["choices"][0] for c in result if c["choices"][0]["finish_reason"]]
    assert sorted(e["index"] for e in ends) == [0, 1] and {e["finish_reason"] for e in ends} == {"length"}


def test_usage_chunk_then_done(http: httpx.Client, client: openai.OpenAI, backend: EchoBackend) -> None:
    result = chunks(http, backend.model, max_tokens=4, stream_options={"include_usage": True})
    assert all(c["usage"] is None and c["choices"] for c in result[:-1])
    assert result[-1]["choices"] == [] and result[-1]["usage"] == {
        "prompt_tokens": 31, "completion_tokens": 4, "total_tokens": 35}
    stream = client.chat.completions.create(model=backend.model, messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=4, stream=True, stream_options={"include_usage": True})
    last = list(stream)[-1]
    assert last.choices == [] and last.usage is not None and last.usage.total_tokens == 35


def test_logprobs(http: httpx.Client, backend: EchoBackend) -> None:
    if not backend.logprobs:  # the backend returns none: refused, naming the parameter and the backend
        for stream in (False, True):
            response = http.post("/v1/chat/completions", json={
                "model": backend.model, "messages": [{"role": "user", "content": "hi"}], "logprobs": True,
                "stream": stream})
            assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"
            assert backend.adapter in response.json()["error"]["message"]
        return
    choice = chat(http, backend.model, max_tokens=3, logprobs=True)["choices"][0]
    content = choice["logprobs"]["content"]
    assert [(e["token"], round(e["logprob"], 3)) for e in content] == [("<|im_start|>", -0.1), ("system", -0.2),
                                                                        ("\n", -0.3)]
    assert content[1]["bytes"] == list(b"system") and content[1]["top_logprobs"] == []
    streamed = chunks(http, backend.model, max_tokens=3, logprobs=True, top_logprobs=0)
    entries = [e for c in streamed[1:-1] for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["token"] for e in entries] == ["<|im_start|>", "system", "\n"]


def test_the_seeds_example_as_written(http: httpx.Client, backend: EchoBackend) -> None:
    """Denglin's manual, with its model name replaced: `"stream":false`, a system and a user message."""
    body = json.loads('''{
    "model": "MODEL", "stream":false,
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Who won the world series in 2020?"}
        ]
    }'''.replace("MODEL", backend.model))
    result = chat(http, **body)
    assert result["choices"][0]["message"] == {"role": "assistant", "content": "system\nYou are a helpful assistant.",
                                               "refusal": None}


def test_an_error_after_the_headers_is_an_sse_error_then_done(http: httpx.Client, backend: EchoBackend) -> None:
    events = stream_events(http, "/v1/chat/completions", {"model": backend.failing, "stream": True,
                                                          "messages": [{"role": "user", "content": "hi"}]})
    assert [e.name for e in events][-2:] == ["error", None] and events[-1].data == "[DONE]"
    assert json.loads(events[0].data)["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    validate(json.loads(events[-2].data), "ErrorResponse")


def _bad_requests() -> list[tuple[str, dict[str, Any], int, str | None]]:
    hi = [{"role": "user", "content": "hi"}]
    return [
        ("empty messages", {"messages": []}, 400, "messages"),
        ("missing messages", {"messages": None}, 400, "messages"),
        ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
        ("missing content", {"messages": [{"role": "user"}]}, 400, "messages[0].content"),
        ("image for a model without image input", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]}]}, 400,
         "messages[0].content[0].image_url.url"),
        ("n 0", {"messages": hi, "n": 0}, 400, "n"),
        ("n 17", {"messages": hi, "n": 17}, 400, "n"),
        ("temperature -1", {"messages": hi, "temperature": -1}, 400, "temperature"),
        ("temperature 2.1", {"messages": hi, "temperature": 2.1}, 400, "temperature"),
        ("top_p -0.1", {"messages": hi, "top_p": -0.1}, 400, "top_p"),
        ("top_p 1.1", {"messages": hi, "top_p": 1.1}, 400, "top_p"),
        ("max_tokens negative", {"messages": hi, "max_tokens": -5}, 400, "max_tokens"),
        ("max_tokens 0", {"messages": hi, "max_tokens": 0}, 400, "max_tokens"),
        ("17 stop strings", {"messages": hi, "stop": [str(i) for i in range(17)]}, 400, "stop"),
        ("reasoning_effort unknown", {"messages": hi, "reasoning_effort": "extreme"}, 400, "reasoning_effort"),
        ("prompt longer than the context", {"messages": [{"role": "user", "content": "word " * 300}]}, 400,
         "messages"),
        ("max_tokens beyond the context", {"messages": hi, "max_tokens": 250}, 400, "max_tokens"),
        ("unknown model", {"model": "no-such-model", "messages": hi}, 404, "model"),
        ("embedding model", {"model": "all-minilm-l6-v2", "messages": hi}, 400, "model"),
        ("tool_choice naming a tool not in tools", {"messages": hi, "tools": [TOOL], "tool_choice": {
            "type": "function", "function": {"name": "other"}}}, 400, "tool_choice"),
        ("tools with non-object parameters", {"messages": hi, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": [1]}}]}, 400, "tools"),
        ("json_schema without schema", {"messages": hi, "response_format": {
            "type": "json_schema", "json_schema": {"name": "x"}}}, 400, "response_format"),
        ("invalid JSON Schema", {"messages": hi, "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "required": "a"}}}}, 400, "response_format"),
        ("tool message without tool_call_id", {"messages": [*hi, {"role": "tool", "content": "21"}]}, 400,
         "messages[1].tool_call_id"),
        ("129 tools", {"messages": hi, "tools": [
            {"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, 400, "tools"),
        ("schema over the size limit", {"messages": hi, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "description": "x" * 70_000}}}]}, 400, "tools"),
        ("min_p 2", {"messages": hi, "min_p": 2}, 400, "min_p"),
        ("stream_options without stream", {"messages": hi, "stream_options": {"include_usage": True}}, 400,
         "stream_options"),
    ]


@pytest.mark.parametrize(("case", "body", "status", "param"), _bad_requests(), ids=[c[0] for c in _bad_requests()])
def test_bad_requests_get_openai_errors(http: httpx.Client, backend: EchoBackend, case: str, body: dict[str, Any],
                                        status: int, param: str | None) -> None:
    for stream in (False, True) if "stream_options" not in body else (False,):
        response = http.post("/v1/chat/completions", json={"model": backend.model, **body, "stream": stream})
        assert response.status_code == status, response.text
        error = response.json()
        validate(error, "ErrorResponse")
        assert error["error"]["param"] == param and "Traceback" not in response.text and "detail" not in error
    assert chat(http, backend.model, max_tokens=2)["choices"][0]["message"]["content"] == "system"


def test_the_openai_sdk_raises_the_error_with_its_param(client: openai.OpenAI, backend: EchoBackend) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=backend.model, messages=[{"role": "user", "content": "hi"}], n=17)
    assert info.value.param == "n"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])


def test_chat_template_kwargs_are_served_not_refused(http: httpx.Client, backend: EchoBackend) -> None:
    """SmolLM2's template reads no extra variable, so the answer is the same as without them (that the
    template sees them is tests/unit/test_llm_chat_template.py's)."""
    plain = chat(http, backend.model, max_tokens=3)["choices"][0]["message"]["content"]
    with_kwargs = chat(http, backend.model, max_tokens=3, chat_template_kwargs={"enable_thinking": False})
    assert with_kwargs["choices"][0]["message"]["content"] == plain
    assert chat(http, backend.model, max_tokens=3, reasoning_effort="low")["choices"][0]["message"]["content"] == plain


def test_a_knob_the_backend_lacks_is_refused_naming_it_and_the_backend(http: httpx.Client,
                                                                        backend: EchoBackend) -> None:
    for param, value in backend.lacks.items():
        extra = {"logprobs": True, "top_logprobs": value} if param == "top_logprobs" else {param: value}
        for stream in (False, True):
            response = http.post("/v1/chat/completions", json={
                "model": backend.model, "messages": [{"role": "user", "content": "hi"}], "stream": stream, **extra})
            assert response.status_code == 400, response.text
            error = response.json()
            validate(error, "ErrorResponse")
            assert error["error"]["param"] == param and backend.adapter in error["error"]["message"], error
    assert chat(http, backend.model, max_tokens=2)["choices"][0]["message"]["content"] == "system"


def test_sixteen_stop_strings_as_autocomplete_clients_send_them(http: httpx.Client) -> None:
    stops = [f"\n{word}" for word in ("def", "class", "if", "#", "//", "/*", "```", "<|", "print")]
    stops += ["zz1", "zz2", "zz3", "zz4", "zz5", "zz6", " helpful"]
    assert len(stops) == 16
    stopped = chat(http, FT_ECHO, stop=stops)["choices"][0]
    assert stopped["message"]["content"] == "system\nYou are a" and stopped["finish_reason"] == "stop"


def test_tools_reach_a_template_without_tool_support_in_the_hermes_format(http: httpx.Client) -> None:
    """SmolLM2's template renders no tools: they are described in the system message, which ft-echo repeats
    until its context is full. No tool call comes of it."""
    result = chat(http, FT_ECHO, tools=[TOOL])["choices"][0]
    content = result["message"]["content"]
    assert content.startswith("system\nYou may call one or more functions")
    assert f"<tools>\n{json.dumps(TOOL)}\n</tools>" in content
    assert "tool_calls" not in result["message"] and result["finish_reason"] == "length"  # the context is full
    unused = chat(http, FT_ECHO, tools=[TOOL], tool_choice="none")
    assert unused["choices"][0]["message"]["content"].startswith(DEFAULT_SYSTEM)


def test_an_agents_turn_is_replayed_to_the_template(http: httpx.Client) -> None:
    """ft-echo repeats the rendered system message: an earlier call and its result are in the prompt."""
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"zone": "UTC"}'}}
    messages = [{"role": "system", "content": "Tools."}, {"role": "user", "content": "time?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12:00"}]
    response = http.post("/v1/chat/completions", json={"model": FT_ECHO, "messages": messages, "tools": [TOOL],
                                                       "tool_choice": "none", "max_tokens": 3})
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]["prompt_tokens"]
    without = http.post("/v1/chat/completions", json={"model": FT_ECHO, "messages": messages[:2], "max_tokens": 3})
    assert usage > without.json()["usage"]["prompt_tokens"] + 20  # the call and its result are in the prompt


FT_SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": FT_SCHEMA}, "response_format"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [TOOL], "tool_choice": "required"}, "tool_choice"),
], ids=["json_schema", "json_object", "required"])
def test_fastertransformer_refuses_what_it_cannot_enforce(http: httpx.Client, body: dict[str, Any], param: str) -> None:
    hi = [{"role": "user", "content": "hi"}]
    response = http.post("/v1/chat/completions", json={"model": FT_ECHO, "messages": hi, **body})
    assert response.status_code == 400, response.text
    error = response.json()
    validate(error, "ErrorResponse")
    assert error["error"]["param"] == param and "fastertransformer" in error["error"]["message"], error
