"""Custom tools in the llm service: shown to the model as functions of one string, `input`; earlier calls
replayed with `{"input": ...}`; a forced call's whole answer is the raw input (held to the tool's grammar
by guided decoding, which a backend without it cannot do); in `auto` and `required` the model's
`{"input": ...}` arguments are unwrapped so that the call carries the raw input."""

from __future__ import annotations

import json

import grpc
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Guide
from services.llm.custom_tools import INPUT_SCHEMA, CustomCalls, RawParser, raw_input
from services.llm.toolcalls import HermesParser, JsonListParser, ToolCallParser
from services.llm.tools import ChatTools, ToolPlan, forced_calls_schema, template_messages
from tests.unit.test_llm_params import FT, Backend, policy
from tritongate.llm.v1 import llm_pb2

PATCH = '*** Begin Patch\n*** Add File: a.txt\n+hello "world" {}\n*** End Patch\n'
LARK_EBNF = 'root ::= "*** Begin Patch\\n" [^\\x00]* "*** End Patch\\n"'
WEATHER = llm_pb2.Tool(name="get_weather", parameters='{"type": "object", "properties": {"city": {"type": "string"}}}')
APPLY_PATCH = llm_pb2.Tool(name="apply_patch", description="Edit files.", custom=True,
                           grammar=llm_pb2.Guide(grammar=LARK_EBNF))
NOTE = llm_pb2.Tool(name="note", custom=True)  # format text: any input
GUIDED = Backend("guided_decoding")


def chat(*tools: llm_pb2.Tool, mode: str = "auto", function: str = "",
         messages: tuple[llm_pb2.ChatMessage, ...] = ()) -> llm_pb2.Chat:
    return llm_pb2.Chat(messages=list(messages) or [llm_pb2.ChatMessage(role="user", content="Go")], tools=tools,
                        tool_choice=llm_pb2.ToolChoice(mode=mode, function=function))


def plan(request: llm_pb2.Chat, backend: Backend = GUIDED) -> ToolPlan:
    return ToolPlan.of(request, ChatTools.of(request), "hermes", policy(backend=backend))


def calls(parser: ToolCallParser, pieces: list[str]) -> tuple[str, list[llm_pb2.ToolCallDelta]]:
    content, deltas = [], []
    for piece in [*pieces, None]:
        text, found = parser.feed(piece) if piece is not None else parser.finish()
        content.append(text)
        deltas.extend(found)
    return "".join(content), deltas


def joined(deltas: list[llm_pb2.ToolCallDelta]) -> list[tuple[str, str]]:
    """(name, arguments) per call, each call's first piece carrying its id and name."""
    found: dict[int, list[str]] = {}
    for delta in deltas:
        assert (delta.index not in found) == bool(delta.id and delta.name)
        found.setdefault(delta.index, [delta.name]).append(delta.arguments)
    return [(parts[0], "".join(parts[1:])) for _, parts in sorted(found.items())]


def test_a_custom_tool_is_shown_as_a_function_of_one_string() -> None:
    tools = ChatTools.of(chat(WEATHER, APPLY_PATCH, NOTE))
    assert tools.objects[1] == {"type": "function", "function": {"name": "apply_patch", "description": "Edit files.",
                                                                 "parameters": INPUT_SCHEMA}}
    assert tools.custom == {"apply_patch": Guide("grammar", LARK_EBNF), "note": None}
    assert ChatTools.of(chat(APPLY_PATCH, mode="none")).custom == {}  # no tools shown: none to unwrap either


def test_an_earlier_custom_call_is_replayed_with_its_input() -> None:
    earlier = llm_pb2.ChatMessage(role="assistant", tool_calls=[
        llm_pb2.ToolCall(id="call_1", name="apply_patch", arguments=PATCH, custom=True),
        llm_pb2.ToolCall(id="call_2", name="get_weather", arguments='{"city": "Paris"}')])
    request = chat(APPLY_PATCH, WEATHER, messages=(llm_pb2.ChatMessage(role="user", content="Go"), earlier))
    native = template_messages(request, native=True)[1]["tool_calls"]
    assert [call["function"]["arguments"] for call in native] == [{"input": PATCH}, {"city": "Paris"}]
    hermes = template_messages(request, native=False, tools=ChatTools.of(request))
    assert json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}) in hermes[2]["content"]
    assert '"name": "apply_patch"' in hermes[0]["content"] and '"input": {"type": "string"}' in hermes[0]["content"]


def test_a_forced_custom_tool_with_a_grammar_is_held_to_it() -> None:
    forced = plan(chat(WEATHER, APPLY_PATCH, function="apply_patch"))
    assert forced.guide == Guide("grammar", LARK_EBNF) and forced.forced and forced.param == "tools"
    assert isinstance(forced.parser and forced.parser(), RawParser)
    regex = llm_pb2.Tool(name="pick", custom=True, grammar=llm_pb2.Guide(regex="(yes|no)"))
    assert plan(chat(regex, function="pick")).guide == Guide("regex", "(yes|no)")


def test_a_forced_custom_tool_without_a_grammar_needs_no_guided_decoding() -> None:
    forced = plan(chat(NOTE, function="note"), backend=FT)
    assert forced.guide is None and forced.forced and isinstance(forced.parser and forced.parser(), RawParser)


def test_a_backend_without_guided_decoding_refuses_a_forced_grammar() -> None:
    with pytest.raises(ServiceError) as info:
        plan(chat(APPLY_PATCH, function="apply_patch"), backend=FT)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.param == "tool_choice"
    assert "custom tool with a grammar" in info.value.message and "guided decoding" in info.value.message


def test_the_forced_raw_input_streams_as_it_comes() -> None:
    content, deltas = calls(RawParser("apply_patch"), ["  *** Begin", " Patch\n", "", PATCH[15:]])
    assert content == "" and joined(deltas) == [("apply_patch", "  *** Begin Patch\n" + PATCH[15:])]
    assert len(deltas) == 3  # streamed: a piece per piece of text
    assert joined(calls(RawParser("note"), [])[1]) == [("note", "")]  # forced: a call even with no input


HERMES_CALLS = ('I will edit it.\n<tool_call>\n{"name": "apply_patch", "arguments": ' +
                json.dumps({"input": PATCH}) + '}\n</tool_call>\n<tool_call>\n{"name": "get_weather", '
                '"arguments": {"city": "Paris"}}\n</tool_call>')


@pytest.mark.parametrize("split", ["whole", "characters"])
def test_auto_unwraps_a_custom_calls_input(split: str) -> None:
    parser = plan(chat(APPLY_PATCH, WEATHER)).parser
    assert parser is not None
    content, deltas = calls(parser(), [HERMES_CALLS] if split == "whole" else list(HERMES_CALLS))
    assert content == "I will edit it.\n"
    assert joined(deltas) == [("apply_patch", PATCH), ("get_weather", '{"city": "Paris"}')]
    custom = [d for d in deltas if d.index == 0]
    assert [d.arguments for d in custom] == ["", PATCH]  # the name at once, the input in one piece once complete
    # The input goes out as soon as the call's object is complete, before the end of the text.
    ended = HERMES_CALLS.index("}\n</tool_call>") + 1
    assert [d.arguments for d in parser().feed(HERMES_CALLS[:ended])[1]] == ["", PATCH]


def test_required_includes_custom_tools_with_their_input_and_unwraps_it() -> None:
    request = chat(WEATHER, APPLY_PATCH, mode="required")
    forced = plan(request)
    assert forced.guide is not None and forced.forced
    schema = json.loads(forced.guide.text)
    assert schema["items"]["anyOf"][1]["properties"] == {"name": {"type": "string", "enum": ["apply_patch"]},
                                                         "arguments": INPUT_SCHEMA}
    assert forced.guide.text == forced_calls_schema(ChatTools.of(request), True)
    assert forced.parser is not None and isinstance(forced.parser(), CustomCalls)
    output = json.dumps([{"name": "apply_patch", "arguments": {"input": PATCH}}])
    assert joined(calls(forced.parser(), list(output))[1]) == [("apply_patch", PATCH)]


def test_arguments_that_are_not_an_input_object_come_as_written() -> None:
    assert raw_input(json.dumps({"input": "x"})) == "x"
    assert raw_input('{"patch": "x"}') == '{"patch": "x"}' and raw_input("plain") == "plain"
    cut = '<tool_call>{"name": "apply_patch", "arguments": {"input": "*** Beg'  # the text ended mid-call
    _, deltas = calls(CustomCalls(HermesParser(), {"apply_patch"}), [cut])
    assert joined(deltas) == [("apply_patch", '{"input": "*** Beg')]


def test_without_custom_tools_the_parser_is_the_familys_own() -> None:
    parser = plan(chat(WEATHER)).parser
    assert parser is not None and isinstance(parser(), HermesParser)
    required = plan(chat(WEATHER, mode="required")).parser
    assert required is not None and isinstance(required(), JsonListParser)


def test_a_forced_function_keeps_its_schema_and_param() -> None:
    forced = plan(chat(WEATHER, APPLY_PATCH, function="get_weather"))
    assert forced.guide == Guide("json_schema", WEATHER.parameters) and forced.param == "tool_choice"
