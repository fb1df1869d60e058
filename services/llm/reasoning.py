"""A reasoning model's thinking out of its text, incrementally: each parser takes a chat completion's text as
it streams and splits it into reasoning and content, holding back only what may still turn out to be a
tag. The content then goes to the tool-call parser (services/llm/toolcalls.py) as any model's text would.

Families (`reasoning_parser` in the model configuration, or detected from the chat template):
- `deepseek_r1` (DeepSeek-R1 and its distills): `<think>…</think>` then the answer. The output is thinking
  from its start, whether or not it opens with `<think>` (R1's templates put the tag in the prompt); an
  output that never closes it is all thinking (cut by `max_tokens`, it has no content).
- `qwen3` (Qwen3, QwQ, DeepSeek-V3.1 and other `enable_thinking` templates): thinking only when the output
  opens with `<think>` or the prompt ends with it (thinking-only templates); a prompt that ends with
  `</think>` (`enable_thinking: false` renders an empty thinking block) has none.
- `gpt_oss` (OpenAI's gpt-oss, the harmony format): `<|channel|>analysis<|message|>…<|end|>` is thinking,
  the `final` and `commentary` channels are content; a message to a function (`to=functions.NAME`) is
  written as the Hermes call `<tool_call>{"name": NAME, "arguments": …}</tool_call>` for the tool-call
  parser. The service keeps special tokens in its text for this family.
Whitespace around the thinking (the newlines after `<think>` and after `</think>`) belongs to neither.

A choice's parser runs in its `Thinking`, which also counts the thinking's tokens for the usage.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Literal

ReasoningName = Literal["deepseek_r1", "qwen3", "gpt_oss"]
WHITESPACE = " \t\r\n"
OPEN, CLOSE = "<think>", "</think>"
DEEPSEEK_ASSISTANT = "<\uff5cAssistant\uff5c>"  # DeepSeek's role token, written with fullwidth bars
# The prompt's end: the template opened the thinking (R1, thinking-only templates) or closed it.
_PROMPT_END = re.compile(r"(</?think>)\s*$")


class _Trimmed:
    """One stretch of text without its leading and trailing whitespace: trailing whitespace is held until
    more text follows it."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""

    def add(self, text: str) -> str:
        if not self.started:
            text = text.lstrip(WHITESPACE)
            self.started = bool(text)
        if not text:
            return ""
        body = text.rstrip(WHITESPACE)
        out = self.held + body if body else ""
        self.held = text[len(body):] if body else self.held + text
        return out


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (held back: the tag may be coming)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


class ReasoningParser:
    """Text in, (reasoning, content) out; `finish` releases what was held back."""

    @property
    def inside(self) -> bool:
        """Whether the text fed so far leaves the parser inside the thinking."""
        raise NotImplementedError

    def feed(self, text: str) -> tuple[str, str]:
        raise NotImplementedError

    def finish(self) -> tuple[str, str]:
        raise NotImplementedError


class ThinkParser(ReasoningParser):
    """`<think>…</think>`: `thinking` says whether the output starts inside the thinking (its opening tag in
    the prompt, or the family's rule); an opening tag at the very start is taken either way."""

    def __init__(self, thinking: bool) -> None:
        self.default = "thinking" if thinking else "content"
        self.state = "start"  # start (an opening tag may come), thinking, content
        self.pending = ""  # text not yet decided: whitespace and a partial tag
        self.reasoning = _Trimmed()
        self.content_started = False  # content's leading whitespace (after </think>) is dropped

    @property
    def inside(self) -> bool:
        return self.state == "thinking" or (self.state == "start" and self.default == "thinking")

    def feed(self, text: str) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        text, self.pending = self.pending + text, ""
        while text:
            if self.state == "start":
                head = text.lstrip(WHITESPACE)
                if head.startswith(OPEN):
                    text, self.state = head[len(OPEN):], "thinking"
                    continue
                if OPEN.startswith(head):  # nothing yet, or the start of the tag
                    self.pending = text
                    break
                self.state = self.default
                if self.state == "content":
                    self.content_started = True  # the answer's own whitespace stays
            elif self.state == "thinking":
                end = text.find(CLOSE)
                if end >= 0:
                    reasoning.append(self.reasoning.add(text[:end]))
                    text, self.state = text[end + len(CLOSE):], "content"
                    continue
                keep = _partial_suffix(text, CLOSE)
                reasoning.append(self.reasoning.add(text[: len(text) - keep]))
                self.pending = text[len(text) - keep:]
                break
            else:
                if not self.content_started:
                    text = text.lstrip(WHITESPACE)
                    self.content_started = bool(text)
                content.append(text)
                break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.state == "start" and self.default == "content":
            return "", rest
        return (self.reasoning.add(rest), "") if self.state != "content" else ("", rest)


# Harmony's markup: a message is `<|start|>{role and header}<|channel|>{channel}[ to=...]<|message|>{body}`
# ended by `<|end|>`, `<|call|>` or `<|return|>`; the assistant's first header starts in the prompt.
MESSAGE, START = "<|message|>", "<|start|>"
BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>", START)
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
_RECIPIENT = re.compile(r"\bto=functions\.([^\s<]+)")


class HarmonyParser(ReasoningParser):
    """gpt-oss: each message's body goes by its header's channel (`analysis`: reasoning, others: content).
    An output that does not open with harmony markup is all content."""

    def __init__(self) -> None:
        self.state = "header"  # header (up to <|message|>), body, plain (no markup)
        self.pending = ""
        self.channel = ""  # of the current message; "call" for a message to a function
        self.reasoning = _Trimmed()
        self.opened = False  # whether any markup was seen

    @property
    def inside(self) -> bool:
        return self.state == "body" and self.channel == "analysis"

    def feed(self, text: str) -> tuple[str, str]:
        reasoning: list[str] = []
        content: list[str] = []
        text, self.pending = self.pending + text, ""
        while text:
            if self.state == "plain":
                content.append(text)
                break
            if self.state == "header":
                if not self.opened and not "<|".startswith(text.lstrip(WHITESPACE)[:2]):
                    self.state = "plain"
                    continue
                self.opened = self.opened or len(text.lstrip(WHITESPACE)) >= 2
                end = text.find(MESSAGE)
                if end < 0:
                    self.pending = text
                    break
                found, call = _CHANNEL.search(text[:end]), _RECIPIENT.search(text[:end])
                self.channel = found.group(1) if found else ""
                if call is not None:
                    self.channel = "call"
                    content.append(f'<tool_call>{{"name": {json.dumps(call.group(1))}, "arguments": ')
                text, self.state = text[end + len(MESSAGE):], "body"
                continue
            ends = [(i, tag) for tag in BODY_ENDS if (i := text.find(tag)) >= 0]
            cut, tag = min(ends) if ends else (-1, "")
            body = text[:cut] if ends else text[: len(text) - max(_partial_suffix(text, t) for t in BODY_ENDS)]
            out = self.reasoning.add(body) if self.channel == "analysis" else body
            (reasoning if self.channel == "analysis" else content).append(out)
            if ends:
                # A new message's header: after an analysis message, the thinking so far ends with a break.
                if self.channel == "analysis":
                    self.reasoning.held = self.reasoning.held or ("\n" if self.reasoning.started else "")
                if self.channel == "call":
                    content.append("}</tool_call>")
                text, self.state = text[cut + (0 if tag == START else len(tag)):], "header"
                continue
            self.pending = text[len(body):]
            break
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.state == "plain" or (self.state == "header" and not self.opened):
            return "", rest
        if self.state == "body" and self.channel == "analysis":
            return self.reasoning.add(rest), ""
        if self.state == "body":
            return "", rest + ("}</tool_call>" if self.channel == "call" else "")
        return "", ""


def thinks_from_prompt(prompt: str) -> bool | None:
    """True when the prompt ends with `<think>` (the template started the thinking), False when it ends
    with `</think>` (the template turned thinking off), None otherwise (the model decides)."""
    found = _PROMPT_END.search(prompt[-100:])
    return None if found is None else found.group(1) == OPEN


def make_parser(name: ReasoningName, prompt: str) -> ReasoningParser | None:
    """One choice's parser for a chat rendered as `prompt`; None when the prompt turned thinking off."""
    if name == "gpt_oss":
        return HarmonyParser()
    started = thinks_from_prompt(prompt)
    if started is False:
        return None
    return ThinkParser(thinking=bool(started) or name == "deepseek_r1")


class Thinking:
    """One choice's thinking: taken out of its text as it streams, and its tokens counted from the steps:
    every token from the one that opens the thinking through the one that closes it (a token counts when
    the parser is inside the thinking before or after its text, which may be none yet: part of a
    character). Text steps bring text without its tokens: the thinking they bring is counted with the
    model's tokenizer, as the tokens of a text step the backend does not count are
    (services/llm/completion.py)."""

    def __init__(self, parser: ReasoningParser, count: Callable[[str], int]) -> None:
        self.parser = parser
        self.count = count  # text → its tokens
        self.tokens = 0  # token steps' tokens that came inside the thinking
        self.texts: list[str] = []  # the thinking text steps brought

    def split(self, text: str, released: Sequence[str] | None, final: bool = False) -> tuple[str, str]:
        """A delta's text as (thinking, content). `released`: the text of each token behind it, in order (what
        follows them came with no new token); None for a text step. `final`: the completion's end, which
        releases what the parser held back."""
        tokens = released or ()
        pieces = [*tokens, text[sum(map(len, tokens)):]]
        thinking: list[str] = []
        content: list[str] = []
        for i, piece in enumerate(pieces):
            inside = self.parser.inside
            if piece:
                more, rest = self.parser.feed(piece)
                thinking.append(more)
                content.append(rest)
            if i < len(tokens) and (inside or self.parser.inside):
                self.tokens += 1
        if final:
            more, rest = self.parser.finish()
            thinking.append(more)
            content.append(rest)
        thought = "".join(thinking)
        if released is None and thought:
            self.texts.append(thought)
        return thought, "".join(content)

    def used(self, consumed: int) -> int:
        """The thinking's tokens, at most the `consumed` tokens of its completion."""
        return min(self.tokens + (self.count("".join(self.texts)) if self.texts else 0), consumed)


def detect_parser(template_source: str) -> ReasoningName | None:
    """The family a chat template's thinking markup belongs to; None for a template without any."""
    if "<|channel|>" in template_source:
        return "gpt_oss"
    if CLOSE not in template_source:
        return None
    return "deepseek_r1" if DEEPSEEK_ASSISTANT in template_source else "qwen3"
