"""The tool-call parsers on each family's real output format, fed whole, one character at a time, and
split in two at every boundary (the text deltas of a stream are whole characters): the same content and
the same calls every time, ids and names first, arguments as JSON text, no markup in the content."""

from __future__ import annotations

import json
from typing import Any

import pytest

from services.llm.toolcalls import (
    HermesParser,
    JsonListParser,
    Llama3JsonParser,
    MistralParser,
    NamedParser,
    ToolCallParser,
    detect_parser,
)

WEATHER = {"city": "Paris", "unit": "celsius", "note": "a \"quoted\" {brace} — été"}
TIME = {"zone": "Europe/Rome"}

# (parser factory, the model's text, the content, the calls as (name, arguments))
CASES: list[tuple[str, Any, str, str, list[tuple[str, Any]]]] = [
    ("hermes one call (Qwen 2.5)", HermesParser,
     '<tool_call>\n{"name": "get_weather", "arguments": ' + json.dumps(WEATHER) + '}\n</tool_call>',
     "", [("get_weather", WEATHER)]),
    ("hermes content then two calls", HermesParser,
     'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
     '<tool_call>\n{"name": "get_time", "arguments": ' + json.dumps(TIME) + '}\n</tool_call>',
     "Let me check.\n", [("get_weather", {"city": "Paris"}), ("get_time", TIME)]),
    ("hermes markup without a call, then a call", HermesParser,
     'Use <tool_call></tool_call> tags: <tool_call>{"name": "get_time", "arguments": {"zone": "Europe/Rome"}}'
     '</tool_call>', "Use <tool_call></tool_call> tags: ", [("get_time", TIME)]),
    ("hermes placeholder, not a call", HermesParser,
     '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>',
     '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>', []),
    ("hermes no call, a lone <", HermesParser, "1 < 2 and <b>bold</b>", "1 < 2 and <b>bold</b>", []),
    ("llama 3.1 json", Llama3JsonParser,
     '{"name": "get_weather", "parameters": ' + json.dumps(WEATHER) + '}', "", [("get_weather", WEATHER)]),
    ("llama 3.2 python_tag, two calls", Llama3JsonParser,
     '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}; '
     '{"name": "get_time", "parameters": {"zone": "Europe/Rome"}}',
     "", [("get_weather", {"city": "Paris"}), ("get_time", TIME)]),
    ("llama plain answer", Llama3JsonParser, "The weather is {fine}.", "The weather is {fine}.", []),
    ("mistral v0.3", MistralParser,
     '[TOOL_CALLS] [{"name": "get_weather", "arguments": ' + json.dumps(WEATHER) + '}, '
     '{"name": "get_time", "arguments": {"zone": "Europe/Rome"}}]',
     "", [("get_weather", WEATHER), ("get_time", TIME)]),
    ("mistral plain answer with brackets", MistralParser, "Use [TOOL] or [x]", "Use [TOOL] or [x]", []),
    ("forced list (required)", JsonListParser,
     '[{"name":"get_time","arguments":{"zone":"Europe/Rome"}}]', "", [("get_time", TIME)]),
    ("arguments as a JSON string", HermesParser,
     '<tool_call>{"name": "get_time", "arguments": "{\\"zone\\": \\"Europe/Rome\\"}"}</tool_call>',
     "", [("get_time", TIME)]),
]


def run(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[tuple[str, Any]], list[Any]]:
    content, deltas = [], []
    for piece in pieces:
        text, calls = parser.feed(piece)
        content.append(text)
        deltas.extend(calls)
    text, calls = parser.finish()
    content.append(text)
    deltas.extend(calls)
    joined: dict[int, list[str]] = {}
    names: dict[int, str] = {}
    for delta in deltas:
        if delta.index not in joined:
            assert delta.id.startswith("call_") and delta.name, "the first piece of a call has its id and name"
            names[delta.index] = delta.name
            joined[delta.index] = []
        else:
            assert not delta.id and not delta.name
        joined[delta.index].append(delta.arguments)
    assert sorted(joined) == list(range(len(joined)))
    return "".join(content), [(names[i], json.loads("".join(joined[i]))) for i in sorted(joined)], deltas


@pytest.mark.parametrize(("case", "factory", "output", "content", "calls"), CASES, ids=[c[0] for c in CASES])
def test_every_split_gives_the_same_content_and_calls(case: str, factory: Any, output: str, content: str,
                                                      calls: list[tuple[str, Any]]) -> None:
    splits = [[output], list(output)] + [[output[:i], output[i:]] for i in range(1, len(output))]
    for pieces in splits:
        got_content, got_calls, _ = run(factory(), pieces)
        assert (got_content, got_calls) == (content, calls), pieces
        for marker in ("<tool_call>", "</tool_call>", "[TOOL_CALLS]", "<|python_tag|>"):
            assert marker not in got_content or marker in content  # only markup that holds no call


def test_arguments_stream_in_pieces_before_the_call_ends() -> None:
    output = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    _, _, deltas = run(HermesParser(), list(output))
    assert len([d for d in deltas if d.arguments]) > 5  # not one piece at the end


def test_parallel_false_keeps_only_the_first_call() -> None:
    output = CASES[1][2]
    content, calls, _ = run(HermesParser(parallel=False), [output])
    assert content == "Let me check.\n" and calls == [("get_weather", {"city": "Paris"})]


def test_a_named_call_is_the_whole_answer() -> None:
    for pieces in (['{"zone": "Europe/Rome"}'], list('  {"zone": "Europe/Rome"}')):
        assert run(NamedParser("get_time"), pieces)[:2] == ("", [("get_time", TIME)])


def test_the_family_is_detected_from_the_chat_template() -> None:
    assert detect_parser("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert detect_parser("{%- if message.role == 'ipython' %}<|python_tag|>") == "llama3_json"
    assert detect_parser("<tool_call>\\n{{ tool_call | tojson }}") == "hermes"
    assert detect_parser("{{ message.content }}") == "hermes"
