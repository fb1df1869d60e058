"""Anthropic's tool kinds in a Messages request (edge/endpoints/message_tools.py): custom tools offered,
Anthropic-defined client tools offered with their published input schemas, server tools hosted (never
offered), deferred tools offered once the conversation loads them, and tool_choice over what is offered."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from jsonschema.validators import Draft202012Validator
from pydantic import ValidationError

from edge.endpoints import messages
from edge.errors import from_validation

TOOL = {"name": "get_time", "description": "The time in a zone.", "cache_control": {"type": "ephemeral"},
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
DEFERRED = {"name": "NotebookEdit", "input_schema": {"type": "object"}, "defer_loading": True}
SERVER = [{"type": "web_search_20250305", "name": "web_search", "max_uses": 8},
          {"type": "web_fetch_20250910", "name": "web_fetch"},
          {"type": "code_execution_20250825", "name": "code_execution"},
          {"type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25"},
          {"type": "mcp_toolset", "mcp_server_name": "docs"}]
CLIENT = [{"type": "bash_20250124", "name": "bash"}, {"type": "text_editor_20250728", "name": "edit_files"},
          {"type": "text_editor_20250124", "name": "str_replace_editor"}, {"type": "memory_20250818", "name": "memory"}]


def request(**fields: Any) -> messages.MessagesRequest:
    return messages.MessagesRequest.model_validate({"model": "m", "max_tokens": 64,
                                                    "messages": [{"role": "user", "content": "hi"}], **fields})


def refusal(**fields: Any) -> tuple[str | None, str]:
    with pytest.raises(ValidationError) as refused:
        request(**fields)
    error = from_validation(RequestValidationError(refused.value.errors(), body=None))
    return error.param, error.message


def test_server_tools_are_hosted_and_never_offered() -> None:
    proto = messages.generation_input(request(tools=[TOOL, *SERVER])).proto()
    assert [tool.name for tool in proto.chat.tools] == ["get_time"]
    assert [(tool.type, tool.param) for tool in proto.hosted_tools] == [
        (entry["type"], f"tools[{i}]") for i, entry in enumerate(SERVER, start=1)]
    alone = messages.generation_input(request(tools=SERVER[:1])).proto()
    assert not alone.chat.tools and alone.chat.tool_choice.mode == "none" and len(alone.hosted_tools) == 1


def test_client_tools_are_offered_with_their_published_input_schemas_under_the_requests_names() -> None:
    tools = {tool.name: tool for tool in messages.generation_input(request(tools=CLIENT)).proto().chat.tools}
    assert list(tools) == ["bash", "edit_files", "str_replace_editor", "memory"]
    schemas = {name: json.loads(tool.parameters) for name, tool in tools.items()}
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert tools[name].description and schema["type"] == "object"
    assert set(schemas["bash"]["properties"]) == {"command", "restart"}
    assert schemas["edit_files"]["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert"]
    assert schemas["str_replace_editor"]["properties"]["command"]["enum"][-1] == "undo_edit"
    assert {"old_str", "new_str", "insert_line", "view_range", "file_text"} <= set(schemas["edit_files"]["properties"])
    assert schemas["memory"]["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert",
                                                                  "delete", "rename"]
    assert {"insert_text", "old_path", "new_path"} <= set(schemas["memory"]["properties"])


def test_a_deferred_tool_is_offered_once_the_conversation_loads_it() -> None:
    offered = messages.generation_input(request(tools=[TOOL, DEFERRED])).tooling.tools
    assert [tool.name for tool in offered] == ["get_time"]
    searched = [{"role": "user", "content": "Edit the notebook."},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch",
                                                   "input": {"query": "notebook"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                    {"type": "tool_reference", "tool_name": "NotebookEdit"}]}]}]
    loaded = messages.generation_input(request(tools=[TOOL, DEFERRED], messages=searched))
    assert [tool.name for tool in loaded.tooling.tools] == ["get_time", "NotebookEdit"]
    assert loaded.messages[-1].role == "tool" and loaded.messages[-1].content == "NotebookEdit"
    forced = messages.generation_input(request(tools=[TOOL, DEFERRED], messages=searched,
                                               tool_choice={"type": "tool", "name": "NotebookEdit"}))
    assert forced.tooling.tool_choice.function == "NotebookEdit"


def test_a_system_turn_adds_and_withdraws_tools_from_there_on() -> None:
    def changed(*blocks: dict[str, Any]) -> list[str]:
        turns = [{"role": "user", "content": "hi"}, {"role": "system", "content": list(blocks)}]
        offered = messages.generation_input(request(tools=[TOOL, DEFERRED], messages=turns)).tooling.tools
        return [tool.name for tool in offered]

    add = {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "NotebookEdit"}}
    remove = {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "get_time"}}
    assert changed(add) == ["get_time", "NotebookEdit"]
    assert changed(remove, {"type": "text", "text": "Time is up."}) == []
    assert changed(remove, {**remove, "type": "tool_addition"}) == ["get_time"]
    assert changed({"type": "tool_addition", "tool": {"type": "tool_reference", "name": "gone"}}) == ["get_time"]


def test_a_tool_search_result_of_anthropics_loads_its_tools_and_a_server_tool_use_is_dropped() -> None:
    turns = [{"role": "user", "content": "Edit the notebook."},
             {"role": "assistant", "content": [
                 {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_bm25",
                  "input": {"query": "notebook"}},
                 {"type": "tool_search_tool_result", "tool_use_id": "srvtoolu_1", "content": {
                     "type": "tool_search_tool_search_result",
                     "tool_references": [{"type": "tool_reference", "tool_name": "NotebookEdit"}]}},
                 {"type": "text", "text": "Found it."}]},
             {"role": "user", "content": "Go on."}]
    generation = messages.generation_input(request(tools=[DEFERRED, SERVER[3]], messages=turns))
    assert [tool.name for tool in generation.tooling.tools] == ["NotebookEdit"]
    assert [(m.role, m.content, len(m.tool_calls)) for m in generation.messages] == [
        ("user", "Edit the notebook.", 0), ("assistant", "Found it.", 0), ("user", "Go on.", 0)]


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tools": [TOOL, {"type": "bash_20250124"}]}, "tools[1].name", "name"),
    ({"tools": [TOOL, {"type": "custom", "name": "x"}]}, "tools[1].input_schema", "input_schema"),
    ({"tools": [TOOL, {**TOOL, "description": "again"}]}, "tools[1].name", "more than once"),
    ({"tools": [TOOL, "bash"]}, "tools[1]", "object"),
    ({"tools": {"name": "x"}}, "tools", "array"),
    ({"tools": [TOOL, DEFERRED], "tool_choice": {"type": "tool", "name": "NotebookEdit"}}, "tool_choice.name",
     "deferred"),
    ({"tools": [TOOL, *SERVER], "tool_choice": {"type": "tool", "name": "web_search"}}, "tool_choice.name",
     "server tool"),
    ({"tools": [DEFERRED], "tool_choice": {"type": "any"}}, "tool_choice", "needs 'tools'"),
    ({"tools": SERVER, "tool_choice": {"type": "any"}}, "tool_choice", "needs 'tools'"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [
        {"type": "tool_addition", "tool": {"type": "tool_definition", "definition": TOOL}}]}]},
     "messages[1].content[0].tool", "tool_reference"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "system", "content": [
        {"type": "tool_removal", "tool": {"type": "tool_reference"}}]}]}, "messages[1].content[0].tool.name",
     "string"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [
        {"type": "tool_search_tool_result", "tool_use_id": "s", "content": {"tool_references": "NotebookEdit"}}]}]},
     "messages[1].content[0].content", "tool_references"),
])
def test_bad_tools_are_refused_naming_their_place(fields: dict[str, Any], param: str, words: str) -> None:
    found, message = refusal(**fields)
    assert found == param and words in message, message


def test_a_tool_reference_in_a_tool_result_is_checked() -> None:
    turns = [{"role": "user", "content": "x"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "get_time", "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [
                 {"type": "tool_reference"}]}]}]
    assert refusal(tools=[TOOL], messages=turns)[0] == "messages[2].content[0].content[0].tool_name"
