"""Reasoning models on the whole stack, through the openai SDK: echo models behind thinking templates
(tests/templates/echo-think*.jinja) repeat the last message as the model's output, so a test scripts the
thinking. `ft-echo-think` (the `qwen3` parser) sends each token in its own chunk, so `</think>` arrives in
pieces; `vllm-echo-think` (the `deepseek_r1` parser, on the vLLM interface) has `<think>` in its prompt and
an output that never opens it. Answers and chunks are checked against OpenAI's schemas, where the
thinking is the `reasoning_content` extension (DeepSeek's name)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.openai_schema import validate
from tests.support.streams import stream_chunks, stream_events

THINK, R1 = "ft-echo-think", "vllm-echo-think"
THOUGHT, ANSWER = "The user greets me; a short greeting back.", "Hello there!"
# Each model's output for the same thinking and answer: Qwen3 opens the thinking, R1's prompt opened it.
OUTPUTS = {THINK: f"<think>\n{THOUGHT}\n</think>\n\n{ANSWER}", R1: f"{THOUGHT}\n</think>\n\n{ANSWER}"}
TOOL = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"type": "string"}}}}}


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


def streamed(client: openai.OpenAI, **body: Any) -> tuple[str, str, list[Any]]:
    """A streamed chat's thinking, content and chunks."""
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **body))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    return ("".join(getattr(d, "reasoning_content", None) or "" for d in deltas),
            "".join(d.content or "" for d in deltas), chunks)


@pytest.mark.parametrize("model", [THINK, R1])
def test_the_thinking_is_reasoning_content_never_content(client: openai.OpenAI, http: httpx.Client,
                                                         model: str) -> None:
    completion = client.chat.completions.create(model=model, messages=user(OUTPUTS[model]))
    message = completion.choices[0].message
    assert message.content == ANSWER and getattr(message, "reasoning_content", None) == THOUGHT
    assert completion.choices[0].finish_reason == "stop"
    usage = completion.usage
    assert usage is not None and usage.completion_tokens_details is not None
    assert 0 < (usage.completion_tokens_details.reasoning_tokens or 0) < usage.completion_tokens
    validate(completion.model_dump(exclude_unset=True), "CreateChatCompletionResponse")

    thinking, content, chunks = streamed(client, model=model, messages=user(OUTPUTS[model]))
    assert (thinking, content) == (THOUGHT, ANSWER)
    counted = usage.completion_tokens_details.reasoning_tokens
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == counted
    for chunk in stream_chunks(http, "/v1/chat/completions", {"model": model, "messages": user(OUTPUTS[model]),
                                                              "stream": True}):
        validate(chunk, "CreateChatCompletionStreamResponse")
        for choice in chunk["choices"]:
            assert "think>" not in (choice["delta"].get("content") or "")


def test_a_tool_call_after_the_thinking_is_parsed(client: openai.OpenAI) -> None:
    arguments = {"zone": "Europe/Rome"}
    call = json.dumps({"name": "get_time", "arguments": arguments})
    output = f"<think>I need the time there.</think>\n<tool_call>\n{call}\n</tool_call>"
    completion = client.chat.completions.create(model=THINK, messages=user(output), tools=[TOOL])  # type: ignore[list-item]
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert getattr(choice.message, "reasoning_content", None) == "I need the time there."
    [call] = choice.message.tool_calls or []
    assert call.function.name == "get_time" and json.loads(call.function.arguments) == arguments  # type: ignore[union-attr]

    chunks = list(client.chat.completions.create(model=THINK, messages=user(output), tools=[TOOL], stream=True))  # type: ignore[list-item]
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "I need the time there."
    pieces = [piece for d in deltas for piece in d.tool_calls or []]
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == arguments  # type: ignore[union-attr]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", [THINK, R1])
def test_a_length_cut_inside_the_thinking_has_no_content(client: openai.OpenAI, model: str) -> None:
    completion = client.chat.completions.create(model=model, messages=user(OUTPUTS[model]), max_tokens=5)
    choice = completion.choices[0]
    thought = getattr(choice.message, "reasoning_content", None) or ""
    assert choice.finish_reason == "length" and choice.message.content is None
    assert thought and THOUGHT.startswith(thought)
    thinking, content, chunks = streamed(client, model=model, messages=user(OUTPUTS[model]), max_tokens=5)
    assert (thinking, content) == (thought, "")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_template_variables_reach_the_template(client: openai.OpenAI) -> None:
    """`reasoning_effort` is written into the echoed message; `enable_thinking: false` closes the thinking in
    the prompt, so the output is all content."""
    completion = client.chat.completions.create(model=THINK, messages=user("<think>Plan.</think>Done."),
                                                reasoning_effort="low")
    message = completion.choices[0].message
    assert (getattr(message, "reasoning_content", None), message.content) == ("Plan.", "Done. (effort: low)")
    completion = client.chat.completions.create(model=THINK, messages=user("<think>Plan.</think>Done."),
                                                extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    message = completion.choices[0].message
    assert message.content == "<think>Plan.</think>Done." and getattr(message, "reasoning_content", None) is None
    assert completion.usage is not None and completion.usage.completion_tokens_details is None


def test_completions_are_not_parsed(client: openai.OpenAI) -> None:
    completion = client.completions.create(model=THINK, prompt="<think>Plan.</think>Done.<|im_end|>", max_tokens=30)
    assert completion.choices[0].text == "<think>Plan.</think>Done."


def test_earlier_thinking_is_accepted_on_assistant_messages(client: openai.OpenAI) -> None:
    messages = [{"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello", "reasoning_content": "Greet."},
                {"role": "user", "content": "<think>Again.</think>Bye."}]
    completion = client.chat.completions.create(model=THINK, messages=messages)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == "Bye."


@pytest.mark.parametrize("effort", ["extreme", "", 3])
def test_a_reasoning_effort_outside_openais_values_is_refused(http: httpx.Client, effort: Any) -> None:
    response = http.post("/v1/chat/completions",
                         json={"model": THINK, "messages": user("x"), "reasoning_effort": effort})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "reasoning_effort"
    response = http.post("/v1/responses", json={"model": THINK, "input": "x", "reasoning": {"effort": effort}})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "reasoning.effort"


@pytest.mark.parametrize("effort", ["none", "minimal", "xhigh", "max"])
def test_every_openai_reasoning_effort_is_taken(client: openai.OpenAI, effort: str) -> None:
    completion = client.chat.completions.create(model=THINK, messages=user("ok"), reasoning_effort=effort)  # type: ignore[arg-type]
    assert completion.choices[0].message.content == f"ok (effort: {effort})"


REASONING_EVENTS = {"response.reasoning_text.delta": "ResponseReasoningTextDeltaEvent",
                    "response.reasoning_text.done": "ResponseReasoningTextDoneEvent"}


def test_responses_answer_with_a_reasoning_item(client: openai.OpenAI, http: httpx.Client) -> None:
    response = client.responses.create(model=THINK, input=OUTPUTS[THINK], reasoning={"effort": "high"})
    reasoning, message = response.output
    assert message.type == "message"
    assert reasoning.type == "reasoning" and [part.text for part in reasoning.content or []] == [THOUGHT]
    assert response.output_text == f"{ANSWER} (effort: high)"
    assert response.reasoning is not None and response.reasoning.effort == "high"
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0
    validate(response.model_dump(exclude_unset=True), "Response")

    with client.responses.stream(model=THINK, input=OUTPUTS[THINK]) as stream:
        final = stream.get_final_response()
    assert final.output[0].type == "reasoning" and final.output_text == ANSWER

    events = stream_events(http, "/v1/responses", {"model": THINK, "input": OUTPUTS[THINK], "stream": True})
    assert events[-1].data == "[DONE]"
    payloads = [json.loads(event.data) for event in events[:-1]]
    for payload in payloads:
        validate(payload, REASONING_EVENTS.get(payload["type"], "ResponseStreamEvent"))
    deltas = [p["delta"] for p in payloads if p["type"] == "response.reasoning_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == THOUGHT  # token by token
    [done] = [p for p in payloads if p["type"] == "response.reasoning_text.done"]
    assert done["text"] == THOUGHT and done["output_index"] == 0
    assert [p["item"]["type"] for p in payloads if p["type"] == "response.output_item.done"] == ["reasoning", "message"]


def test_a_response_cut_while_thinking_is_incomplete_with_only_reasoning(client: openai.OpenAI) -> None:
    response = client.responses.create(model=THINK, input=OUTPUTS[THINK], max_output_tokens=5)
    assert response.status == "incomplete" and [item.type for item in response.output] == ["reasoning"]
    assert response.output_text == ""


def test_models_say_which_models_reason(client: openai.OpenAI) -> None:
    listed = {model.id: model.model_extra or {} for model in client.models.list()}
    assert listed[THINK]["reasoning"] is True and listed[R1]["reasoning"] is True
    assert listed["ft-echo"]["reasoning"] is False and listed["all-minilm-l6-v2"]["reasoning"] is None


def test_anthropic_thinking_blocks(stack: Any) -> None:
    """Anthropic's Messages API: the thinking is a `thinking` block before the text (streamed as
    `thinking_delta`s), and `thinking: {type: disabled}` reaches the template as `enable_thinking: false`
    (`enabled` as `true`: tests/unit/test_messages.py)."""
    import anthropic

    claude = anthropic.Anthropic(base_url=stack.edge_url, api_key="unused", max_retries=0, timeout=300)
    # A model that thinks answers with its thinking whether or not `thinking` asks for it (the echo models'
    # context is too short for Anthropic's smallest `budget_tokens`, 1024, below `max_tokens`).
    message = claude.messages.create(model=THINK, max_tokens=64, messages=user(OUTPUTS[THINK]))
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == THOUGHT and message.content[1].text == ANSWER  # type: ignore[union-attr]
    with claude.messages.stream(model=THINK, max_tokens=64, messages=user(OUTPUTS[THINK])) as stream:
        kinds = [event.delta.type for event in stream if event.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds[0] == "thinking_delta" and "text_delta" in kinds
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == THOUGHT  # type: ignore[union-attr]
    plain = claude.messages.create(model=THINK, max_tokens=64, thinking={"type": "disabled"},
                                   messages=user("<think>Plan.</think>Done."))
    assert [(block.type, getattr(block, "text", None)) for block in plain.content] == [
        ("text", "<think>Plan.</think>Done.")]  # the template closed the thinking: nothing was parsed out
