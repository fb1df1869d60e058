"""Tool calls out of a model's text, incrementally: each parser takes the completion's text as it streams
and splits it into content and `ToolCallDelta`s (the call's id and name first, then its arguments piece by
piece), holding back only what may still turn out to be markup. Nothing is parsed twice: a parser keeps
its place in the text.

Families (`tool_parser` in the model configuration, or detected from the chat template):
- `hermes` (Hermes, Qwen 2/2.5/3 and the default for templates without tools):
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, any number, after optional content.
- `llama3_json` (Llama 3.1/3.2/3.3): the whole answer is `{"name": ..., "parameters": {...}}` (optionally
  after `<|python_tag|>`), several separated by `;`.
- `mistral` (Mistral v0.3 tokenizers): `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`.
And for calls forced by guided decoding: `json_list` (the answer is a JSON array of {name, arguments}) and
`named` (the answer is the named function's arguments object).
"""

from __future__ import annotations

import json
import uuid
from typing import Literal

from tritongate.llm.v1 import llm_pb2

ParserName = Literal["hermes", "llama3_json", "mistral"]
PARSERS: tuple[ParserName, ...] = ("hermes", "llama3_json", "mistral")
ARGUMENT_KEYS = ("arguments", "parameters")
WHITESPACE = " \t\n\r"


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class _Value:
    """Where one JSON value ends, one character at a time."""

    def __init__(self) -> None:
        self.kind = ""  # "string", "nested" or "scalar" once the first character is seen
        self.depth = 0
        self.in_string = False
        self.escape = False

    def feed(self, char: str) -> Literal["more", "end", "end_before"]:
        """"end": `char` ends the value; "end_before": the value ended just before `char`."""
        if not self.kind:
            self.kind = "string" if char == '"' else "nested" if char in "{[" else "scalar"
            self.in_string, self.depth = char == '"', 1 if char in "{[" else 0
            return "more"
        if self.in_string:
            if self.escape:
                self.escape = False
            elif char == "\\":
                self.escape = True
            elif char == '"':
                self.in_string = False
                if self.kind == "string":
                    return "end"
            return "more"
        if self.kind == "scalar":
            return "end_before" if char in ",}] \t\n\r" else "more"
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            if self.depth == 0:
                return "end"
        return "more"


class _CallObject:
    """One `{"name": ..., "arguments": {...}}` object: gives the name once it is complete and the arguments'
    JSON text as it comes (held until the name is known; an arguments string is decoded whole)."""

    def __init__(self) -> None:
        self.state = "start"  # start, key, colon, value, after
        self.key = ""
        self.raw = ""  # the current key or value's text
        self.value: _Value | None = None
        self.name: str | None = None
        self.arguments = ""  # sent, or waiting for the name
        self.sent_name = False
        self.sent_arguments = 0
        self.done = False
        self.broken = False  # not a call object after all
        self.text = ""  # every character fed

    def feed(self, char: str) -> None:
        """One character; sets `done` after the closing brace, `broken` on anything unexpected."""
        self.text += char
        if self.state == "start":
            if char == "{":
                self.state = "key"
            elif char not in WHITESPACE:
                self.broken = True
        elif self.state == "key":
            self._key(char)
        elif self.state == "colon":
            if char == ":":
                self.state, self.value, self.raw = "value", _Value(), ""
            elif char not in WHITESPACE:
                self.broken = True
        elif self.state == "value":
            self._value(char)
        elif self.state == "after":
            if char == ",":
                self.state, self.raw = "key", ""
            elif char == "}":
                self.done = True
            elif char not in WHITESPACE:
                self.broken = True

    def _key(self, char: str) -> None:
        if not self.raw:
            if char == '"':
                self.raw = char
            elif char == "}":
                self.done = True
            elif char not in WHITESPACE + ",":
                self.broken = True
            return
        self.raw += char
        if char == '"' and not _escaped(self.raw):
            self.key, self.state = json.loads(self.raw), "colon"

    def _value(self, char: str) -> None:
        assert self.value is not None
        if not self.value.kind and char in WHITESPACE:
            return
        ended = self.value.feed(char)
        if ended != "end_before":
            self.raw += char
            if self.key in ARGUMENT_KEYS and self.value.kind != "string":
                self.arguments += char
        if ended == "more":
            return
        try:
            if self.key == "name":
                name = json.loads(self.raw)
                self.name = name if isinstance(name, str) else str(name)
            elif self.key in ARGUMENT_KEYS and self.value.kind == "string":
                self.arguments = json.loads(self.raw)
        except ValueError:  # e.g. a template's placeholder: {"name": <function-name>}
            self.broken = True
            return
        self.state = "after"
        if ended == "end_before":
            self.feed(char)

    def pieces(self) -> tuple[str | None, str]:
        """The name if it is new, and the arguments text not sent yet (none before the name)."""
        if self.name is None:
            return None, ""
        name = None if self.sent_name else self.name
        self.sent_name = True
        if self.value is not None and self.key in ARGUMENT_KEYS and self.value.kind == "string" and \
                self.state == "value":
            return name, ""  # a string of arguments is sent once decoded
        piece = self.arguments[self.sent_arguments:]
        self.sent_arguments = len(self.arguments)
        return name, piece


def _escaped(raw: str) -> bool:
    """Whether the quote ending `raw` is escaped (an odd run of backslashes before it)."""
    run = len(raw) - 1 - len(raw[:-1].rstrip("\\"))
    return run % 2 == 1


class ToolCallParser:
    """The base: content up to markup, then calls; subclasses say where calls start and how they are joined."""

    def __init__(self, parallel: bool = True) -> None:
        self.parallel = parallel
        self.pending = ""  # text not yet decided (may be the start of markup)
        self.call: _CallObject | None = None
        self.sending = False  # the current call's pieces go out (it has a name, and is allowed)
        self.unsent: str | None = None  # see _call_char
        self.ids: list[str] = []  # of the calls sent, in order

    @property
    def calls(self) -> int:
        """Calls sent so far (markup that turned out not to hold a call does not count)."""
        return len(self.ids)

    def feed(self, text: str) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        """More of the completion's text → (content, tool call pieces)."""
        raise NotImplementedError

    def finish(self) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        """The end of the text: what was held back, as content if it never became a call."""
        rest, self.pending = self.pending, ""
        return ("" if self.calls else rest), []

    def _call_char(self, char: str, out: list[llm_pb2.ToolCallDelta]) -> bool:
        """Feed a character to the current call; True when the call has ended (or was not a call: then
        `unsent` holds what it took before the character that showed it, if none of it was sent)."""
        call = self.call
        assert call is not None
        call.feed(char)
        name, arguments = call.pieces()
        if name is not None and not call.broken and (self.parallel or not self.ids):
            self.sending = True
            self.ids.append(call_id())
            out.append(llm_pb2.ToolCallDelta(index=self.calls - 1, id=self.ids[-1], name=name, arguments=arguments))
        elif arguments and self.sending:
            _append(out, self.calls - 1, arguments)
        self.unsent = call.text[:-1] if call.broken and not self.sending else None
        if call.done or call.broken:
            self.sending = False
            self.call = None
            return True
        return False

    def _start_call(self) -> None:
        self.call = _CallObject()


def _append(out: list[llm_pb2.ToolCallDelta], index: int, arguments: str) -> None:
    """More arguments of call `index`, joined with its previous piece in this batch."""
    if out and out[-1].index == index:
        out[-1].arguments += arguments
    else:
        out.append(llm_pb2.ToolCallDelta(index=index, arguments=arguments))


class HermesParser(ToolCallParser):
    START, END = "<tool_call>", "</tool_call>"

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self.closing = False  # after a call's object, before its </tool_call>

    def feed(self, text: str) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        content: list[str] = []
        out: list[llm_pb2.ToolCallDelta] = []
        for char in text:
            if self.call is not None:
                self.closing = self._call_char(char, out)
                if self.unsent is None:
                    continue
                content.append(self._content(self.START + self.unsent))  # markup without a call: text
                self.closing = False
            self.pending += char
            if self.closing:
                head = self.pending.lstrip(WHITESPACE)
                if self.END.startswith(head):
                    if head == self.END:
                        self.pending, self.closing = "", False
                    continue
                self.closing = False  # no closing tag: go on as content
            if self.START in self.pending:
                content.append(self._content(self.pending[: self.pending.index(self.START)]))
                self.pending = ""
                self._start_call()
                continue
            keep = _partial_suffix(self.pending, self.START)
            if keep < len(self.pending) and (not self.calls or self.pending.strip(WHITESPACE)):
                content.append(self._content(self.pending[: len(self.pending) - keep]))
                self.pending = self.pending[len(self.pending) - keep:]
        return "".join(content), out

    def _content(self, text: str) -> str:
        """Text between calls is content only if it is more than whitespace."""
        return "" if self.calls and not text.strip(WHITESPACE) else text


class Llama3JsonParser(ToolCallParser):
    """A call only if the answer starts with `{` (after whitespace or `<|python_tag|>`); `;` between calls."""

    TAG = "<|python_tag|>"

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self.mode = "undecided"  # undecided, content, calls

    def feed(self, text: str) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        out: list[llm_pb2.ToolCallDelta] = []
        for i, char in enumerate(text):
            if self.mode == "content":
                return text[i:], out
            if self.mode == "calls":
                if self.call is not None:
                    self._call_char(char, out)
                elif char == "{":
                    self._start_call()
                    self._call_char(char, out)
                continue
            self.pending += char
            head = self.pending.lstrip(WHITESPACE)
            if head.startswith(self.TAG):
                head = head[len(self.TAG):].lstrip(WHITESPACE)
            elif self.TAG.startswith(head):
                continue  # nothing yet, or the start of the tag
            if not head:
                continue
            if head[0] == "{":
                self.mode, self.pending = "calls", ""
                self._start_call()
                for part in head:
                    if self.call is not None:
                        self._call_char(part, out)
                continue
            self.mode, rest, self.pending = "content", self.pending + text[i + 1:], ""
            return rest, out
        return "", out

    def finish(self) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        rest, self.pending = self.pending, ""
        return ("" if self.mode == "calls" else rest), []


class _ListParser(ToolCallParser):
    """A JSON array of call objects after an optional marker (content before the marker)."""

    MARKER = ""

    def __init__(self, parallel: bool = True) -> None:
        super().__init__(parallel)
        self.mode = "content" if self.MARKER else "list"  # content, list, calls, done

    def feed(self, text: str) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        content: list[str] = []
        out: list[llm_pb2.ToolCallDelta] = []
        for char in text:
            if self.mode == "content":
                self.pending += char
                if self.MARKER in self.pending:
                    before = self.pending[: self.pending.index(self.MARKER)]
                    content.append(before)
                    self.pending, self.mode = "", "list"
                else:
                    keep = _partial_suffix(self.pending, self.MARKER)
                    content.append(self.pending[: len(self.pending) - keep])
                    self.pending = self.pending[len(self.pending) - keep:]
            elif self.mode == "list":
                if char == "[":
                    self.mode = "calls"
                elif char == "{":  # a single object without the array
                    self.mode = "calls"
                    self._start_call()
                    self._call_char(char, out)
            elif self.mode == "calls":
                if self.call is not None:
                    self._call_char(char, out)
                elif char == "{":
                    self._start_call()
                    self._call_char(char, out)
                elif char == "]":
                    self.mode = "done"
        return "".join(content), out


class MistralParser(_ListParser):
    MARKER = "[TOOL_CALLS]"


class JsonListParser(_ListParser):
    """Calls forced by guided decoding (`tool_choice: required`): the answer is the array itself."""


class NamedParser(ToolCallParser):
    """A call of one named function forced by guided decoding: the whole answer is its arguments."""

    def __init__(self, name: str, leading: str = WHITESPACE) -> None:  # `leading`: dropped before the arguments
        super().__init__(parallel=False)
        self.name, self.leading = name, leading

    def feed(self, text: str) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        if not self.calls:
            text = text.lstrip(self.leading)
            if not text:
                return "", []
            self.ids.append(call_id())
            return "", [llm_pb2.ToolCallDelta(index=0, id=self.ids[0], name=self.name, arguments=text)]
        return "", [llm_pb2.ToolCallDelta(index=0, arguments=text)] if text else []


def _partial_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that begins `marker` (to hold back)."""
    for size in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def make_parser(name: ParserName, parallel: bool) -> ToolCallParser:
    parsers: dict[str, type[ToolCallParser]] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser,
                                                "mistral": MistralParser}
    return parsers[name](parallel)


def detect_parser(template_source: str) -> ParserName:
    """The family a chat template's tool markup belongs to; Hermes when it shows none."""
    if "[TOOL_CALLS]" in template_source:
        return "mistral"
    if "<|python_tag|>" in template_source or "ipython" in template_source:
        return "llama3_json"
    return "hermes"
