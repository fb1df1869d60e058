"""Custom tools (the Responses API's `{"type": "custom"}`): tools whose call's input is free text, not JSON
arguments. The model is shown each as a function of one string parameter, `input` (`INPUT_SCHEMA`), and
an earlier call of one is replayed to it as a call with the arguments `{"input": <the input>}`. Its calls
come back with the input itself as their `arguments`:

- forced (`tool_choice` names it): the whole answer is the input (`RawParser`), held to the tool's
  grammar by guided decoding where it has one, streamed as it comes;
- otherwise (`auto`, `required`) the model writes a function call with the arguments `{"input": "..."}`,
  which `CustomCalls` unwraps: the call's id and name go out as soon as they are known, its input in one
  piece once the call's arguments are complete.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from typing import Any

from services.llm.toolcalls import NamedParser, ToolCallParser, call_id
from tritongate.llm.v1 import llm_pb2

INPUT_SCHEMA: dict[str, Any] = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}


class RawParser(NamedParser):
    """A forced call of a custom tool: the whole answer is its input, as it is (leading whitespace too). An
    answer with no text is a call with an empty input: the call was forced."""

    def __init__(self, name: str) -> None:
        super().__init__(name, leading="")

    def finish(self) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        if self.calls:
            return "", []
        self.ids.append(call_id())
        return "", [llm_pb2.ToolCallDelta(index=0, id=self.ids[0], name=self.name)]


def raw_input(arguments: str) -> str:
    """A custom tool's input from the arguments the model wrote for its call: the object's `input`, else
    (the model did not write `{"input": "..."}`) the arguments' text as it is."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value["input"] if isinstance(value, dict) and isinstance(value.get("input"), str) else arguments


def _complete(arguments: str) -> bool:
    """Whether a call's arguments so far are a whole JSON object (a part of one never parses)."""
    if not arguments.rstrip().endswith("}"):
        return False
    try:
        json.loads(arguments)
    except ValueError:
        return False
    return True


class CustomCalls(ToolCallParser):
    """The calls another parser finds, with those of the custom tools (by name) unwrapped: each one's
    arguments are held until they are complete, then its input goes out in one piece (at the end of the
    text, whatever there is of them)."""

    def __init__(self, inner: ToolCallParser, custom: Collection[str]) -> None:
        super().__init__(inner.parallel)
        self.inner, self.custom = inner, custom
        self.open: dict[int, str] = {}  # custom calls whose arguments are not complete: index → arguments so far

    @property
    def calls(self) -> int:
        return self.inner.calls

    def feed(self, text: str) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        content, pieces = self.inner.feed(text)
        return content, self._unwrap(pieces)

    def finish(self) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
        content, pieces = self.inner.finish()
        out = self._unwrap(pieces)
        out += [llm_pb2.ToolCallDelta(index=index, arguments=raw_input(arguments))
                for index, arguments in self.open.items()]
        self.open.clear()
        return content, out

    def _unwrap(self, pieces: list[llm_pb2.ToolCallDelta]) -> list[llm_pb2.ToolCallDelta]:
        out: list[llm_pb2.ToolCallDelta] = []
        for piece in pieces:
            if piece.id and piece.name in self.custom:  # a custom call's first piece: its id and name go out
                self.open[piece.index] = piece.arguments
                out.append(llm_pb2.ToolCallDelta(index=piece.index, id=piece.id, name=piece.name))
            elif piece.index in self.open:
                self.open[piece.index] += piece.arguments
            else:
                out.append(piece)
                continue
            arguments = self.open[piece.index]
            if _complete(arguments):
                out.append(llm_pb2.ToolCallDelta(index=piece.index, arguments=raw_input(arguments)))
                del self.open[piece.index]
        return out
