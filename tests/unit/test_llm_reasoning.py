"""The reasoning parsers (services/llm/reasoning.py): each family's output split into thinking and content,
the same however the text is cut into pieces (every split point, and one character at a time); what the
prompt's end and the chat template say; and one LanguageModel on a scripted vLLM Triton model, where the
tool-call parser takes what the reasoning parser leaves, and the usage counts the thinking's tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from services.llm.reasoning import (
    DEEPSEEK_ASSISTANT as R1,
)
from services.llm.reasoning import (
    ReasoningName,
    Thinking,
    detect_parser,
    make_parser,
    thinks_from_prompt,
)
from services.llm.toolcalls import HermesParser
from tests.unit.test_llm_model import VLLM, generate, model, serving, vllm_steps
from tritongate.llm.v1 import llm_pb2

CALL = json.dumps({"name": "get_time", "arguments": {"zone": "Europe/Rome"}})
HARMONY_CALL = ("<|channel|>analysis<|message|>Need the time.<|end|><|start|>assistant<|channel|>commentary "
                'to=functions.get_time <|constrain|>json<|message|>{"zone": "Europe/Rome"}<|call|>')
# (family, the prompt's end, the model's output, the thinking, the content)
CASES: list[tuple[ReasoningName, str, str, str, str]] = [
    ("qwen3", "assistant\n", "<think>\nThe user greets me.\n</think>\n\nHello!", "The user greets me.", "Hello!"),
    ("qwen3", "assistant\n", "Hello! <think>not at the start</think>", "", "Hello! <think>not at the start</think>"),
    ("qwen3", "assistant\n", "  <thin", "", "  <thin"),
    ("qwen3", "assistant\n<think>\n", "Greeting.</think>Hello!", "Greeting.", "Hello!"),
    ("qwen3", "assistant\n", "<think>cut while thinking </thi", "cut while thinking </thi", ""),
    ("qwen3", "assistant\n", f"<think>Call it.</think>\n<tool_call>{CALL}</tool_call>", "Call it.",
     f"<tool_call>{CALL}</tool_call>"),
    ("deepseek_r1", R1, "Greeting.\n</think>\n\nHello!", "Greeting.", "Hello!"),
    ("deepseek_r1", R1 + "<think>\n", "<think>Twice opened.</think>Hi", "Twice opened.", "Hi"),
    ("deepseek_r1", R1, "never closed", "never closed", ""),
    ("deepseek_r1", R1, "a < b <\n\n</th", "a < b <\n\n</th", ""),
    ("gpt_oss", "<|start|>assistant",
     "<|channel|>analysis<|message|>First.<|end|><|start|>assistant<|channel|>analysis<|message|>Second.<|end|>"
     "<|start|>assistant<|channel|>final<|message|>Hello!<|return|>", "First.\nSecond.", "Hello!"),
    ("gpt_oss", "<|start|>assistant", HARMONY_CALL, "Need the time.",
     '<tool_call>{"name": "get_time", "arguments": {"zone": "Europe/Rome"}}</tool_call>'),
    ("gpt_oss", "<|start|>assistant", "<|channel|>analysis<|message|>cut <|e", "cut <|e", ""),
    ("gpt_oss", "<|start|>assistant", "No markup at all.", "", "No markup at all."),
]


def split(family: ReasoningName, prompt: str, pieces: list[str]) -> tuple[str, str]:
    parser = make_parser(family, prompt)
    assert parser is not None
    thinking, content = "", ""
    for piece in pieces:
        more, text = parser.feed(piece)
        thinking, content = thinking + more, content + text
    more, text = parser.finish()
    return thinking + more, content + text


@pytest.mark.parametrize(("family", "prompt", "output", "thinking", "content"), CASES,
                         ids=[f"{case[0]}: {case[2][:30]}" for case in CASES])
def test_every_split_of_the_output_gives_the_same_thinking_and_content(
        family: ReasoningName, prompt: str, output: str, thinking: str, content: str) -> None:
    assert split(family, prompt, [output]) == (thinking, content)
    assert split(family, prompt, list(output)) == (thinking, content)
    for cut in range(1, len(output)):
        assert split(family, prompt, [output[:cut], output[cut:]]) == (thinking, content), cut


def test_the_thinking_goes_out_as_it_comes_not_at_the_end() -> None:
    parser = make_parser("qwen3", "")
    assert parser is not None
    assert parser.feed("<think>\nOne") == ("One", "")
    assert parser.feed(" two </th") == (" two", "")  # the space waits: the thinking may end there
    assert parser.feed("ink>\n\nAns") == ("", "Ans")
    assert parser.feed("wer") == ("", "wer")
    assert parser.finish() == ("", "")


def test_a_harmony_call_becomes_a_hermes_call_for_the_tool_parser() -> None:
    thinking, content = split("gpt_oss", "", list(HARMONY_CALL))
    calls = HermesParser()
    text, pieces = calls.feed(content)
    assert thinking == "Need the time." and text == "" and calls.calls == 1
    assert pieces[0].name == "get_time" and json.loads("".join(p.arguments for p in pieces)) == {"zone": "Europe/Rome"}


# One text per token: the thinking opens with the third token and closes with the tenth.
TOKENS = ["<", "think", ">", "\n", "One", " two", "\n", "</", "think", ">", "\n\n", "Answer"]


@pytest.mark.parametrize("size", [1, 3, len(TOKENS)])
def test_token_steps_count_every_token_from_the_one_that_opens_the_thinking_through_the_one_that_closes_it(
        size: int) -> None:
    parser = make_parser("qwen3", "")
    assert parser is not None
    thinking = Thinking(parser, count=lambda text: pytest.fail("token steps are never tokenized again"))
    thought, content = "", ""
    for start in range(0, len(TOKENS), size):
        step = TOKENS[start: start + size]
        more, text = thinking.split("".join(step), step)
        thought, content = thought + more, content + text
    more, text = thinking.split("", [], final=True)
    assert (thought + more, content + text) == ("One two", "Answer")
    assert thinking.used(consumed=len(TOKENS)) == 8 and thinking.used(consumed=5) == 5


def test_a_token_that_makes_no_text_yet_counts_where_it_comes() -> None:
    parser = make_parser("deepseek_r1", R1)
    assert parser is not None
    thinking = Thinking(parser, count=len)
    assert thinking.split("", ["", ""]) == ("", "")  # e.g. the first bytes of a character
    assert thinking.split("\u4f60</think>Hi", ["\u4f60", "</think>", "Hi"]) == ("\u4f60", "Hi")
    assert thinking.used(consumed=5) == 4


def test_text_steps_count_their_thinking_with_the_tokenizer() -> None:
    parser = make_parser("qwen3", "")
    assert parser is not None
    thinking = Thinking(parser, count=len)  # one token per character
    assert thinking.split("<think>abc</thi", None) == ("abc", "")
    assert thinking.split("nk>answer", None, final=True) == ("", "answer")
    assert thinking.used(consumed=100) == 3 and thinking.used(consumed=2) == 2


@pytest.mark.parametrize(("prompt", "thinks"), [
    ("<|im_start|>assistant\n<think>\n", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # Qwen3 with enable_thinking false
    ("<think>old</think>answer<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", None),
])
def test_the_prompt_end_says_whether_the_template_opened_or_closed_the_thinking(prompt: str,
                                                                                 thinks: bool | None) -> None:
    assert thinks_from_prompt(prompt) is thinks
    assert (make_parser("qwen3", prompt) is None) == (thinks is False)


@pytest.mark.parametrize(("template", "family"), [
    ("{{ '<|start|>assistant<|channel|>final<|message|>' }}", "gpt_oss"),
    ("{% if enable_thinking is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% endif %}", "qwen3"),
    ("{% set content = content.split('</think>')[-1] %}{{ '" + R1 + "<think>\\n' }}", "deepseek_r1"),
    ("{{ '<|im_start|>assistant\\n' }}", None),
])
def test_the_family_is_detected_from_the_chat_template(template: str, family: str | None) -> None:
    assert detect_parser(template) == family


# A Qwen3-like template: thinking unless `enable_thinking` is false; earlier thinking shown.
TEMPLATE = """{% for m in messages %}<|im_start|>{{ m.role }}
{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}<|im_end|>
{% endfor %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}"""
TOOL = llm_pb2.Tool(name="get_time", parameters=json.dumps({"type": "object"}))


@pytest.fixture
def template(tmp_path: Path) -> str:
    path = tmp_path / "qwen3-like.jinja"
    path.write_text(TEMPLATE)
    return str(path)


def deltas(responses: list[llm_pb2.GenerateResponse]) -> list[llm_pb2.Delta]:
    return [r.delta for r in responses if r.WhichOneof("event") == "delta"]


async def test_thinking_then_a_tool_call_streams_as_reasoning_then_the_call(models_dir: Path, template: str,
                                                                            tokenizer: Any) -> None:
    steps = vllm_steps(("<think>\nI should", 3, "None"), (" call it.\n</thi", 4, "None"),
                       (f"nk>\n\n<tool_call>{CALL}</tool_call>", 12, "stop"))
    async with serving(VLLM, steps) as triton:
        llm = model(models_dir, triton, chat_template=template)
        assert llm.reasoning_family == "qwen3" and llm.card().reasoning  # detected from the template
        chat = llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content="Time?")], tools=[TOOL],
                            tool_choice=llm_pb2.ToolChoice(mode="auto"))
        responses = await generate(llm, chat=chat)
    out = deltas(responses)
    assert "".join(d.reasoning for d in out) == "I should call it."  # steps may be joined (coalesce)
    assert "".join(d.text for d in out) == ""
    calls = [piece for d in out for piece in d.tool_calls]
    assert calls[0].name == "get_time" and json.loads("".join(p.arguments for p in calls)) == {"zone": "Europe/Rome"}
    assert out[-1].finish_reason == "tool_calls"
    usage = responses[-1].usage
    assert usage.reasoning_tokens == len(tokenizer.encode("I should call it.", add_special_tokens=False))
    assert 0 < usage.reasoning_tokens < usage.completion_tokens


async def test_a_length_cut_inside_the_thinking_has_no_content(models_dir: Path, template: str) -> None:
    async with serving(VLLM, vllm_steps(("<think>Still", 2, "None"), (" going", 1, "length"))) as triton:
        llm = model(models_dir, triton, chat_template=template)
        out = deltas(await generate(llm, chat=llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content="?")]),
                                    max_tokens=3))
    assert "".join(d.reasoning for d in out) == "Still going" and "".join(d.text for d in out) == ""
    assert out[-1].finish_reason == "length"


async def test_enable_thinking_false_reaches_the_template_and_nothing_is_parsed(models_dir: Path,
                                                                                template: str) -> None:
    async with serving(VLLM, vllm_steps(("<think>as text</think>", 5, "stop"))) as triton:
        llm = model(models_dir, triton, chat_template=template)
        chat = llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content="Hi"),
                                      llm_pb2.ChatMessage(role="assistant", content="Hello", reasoning="Greet back."),
                                      llm_pb2.ChatMessage(role="user", content="Bye")])
        responses = await generate(llm, chat=chat, chat_template_kwargs={"enable_thinking": False})
        prompt = triton.requests[0].inputs["text_input"][0].decode()
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "<think>Greet back.</think>Hello" in prompt  # the earlier turn's thinking, for the template
    out = deltas(responses)
    assert "".join(d.text for d in out) == "<think>as text</think>" and not any(d.reasoning for d in out)
    assert responses[-1].usage.reasoning_tokens == 0


async def test_reasoning_parser_none_turns_detection_off_and_completions_are_never_parsed(
        models_dir: Path, template: str) -> None:
    async with serving(VLLM, vllm_steps(("<think>a</think>b", 5, "stop"))) as triton:
        off = model(models_dir, triton, chat_template=template, reasoning_parser="none")
        assert off.reasoning_family is None and not off.card().reasoning
        on = model(models_dir, triton, chat_template=template)
        completion = deltas(await generate(on, prompts=llm_pb2.Prompts(prompts=[llm_pb2.Prompt(text="x")])))
    assert "".join(d.text for d in completion) == "<think>a</think>b"
