"""Structured output and tools end to end, enforced by guided decoding: the openai SDK and LangChain → edge
→ llm service → the session's real Triton serving the demo SmolLM2 behind TensorRT-LLM's and vLLM's
interfaces, whose guided decoding is xgrammar's, as in those backends. SmolLM2-135M left alone rarely writes
valid JSON, so a valid answer shows the enforcement. Requests are greedy and short: the model runs on this CPU.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from launcher.stack import DEMO_LLMS, LocalStack
from tests.e2e.test_responses import EVENT_SCHEMAS
from tests.support.openai_schema import validate
from tests.support.streams import stream_events

GUIDED = [DEMO_LLMS["tensorrt_llm"], DEMO_LLMS["vllm"]]
FT = DEMO_LLMS["fastertransformer"]


@pytest.fixture(scope="module")
def demo_client(stack: LocalStack) -> openai.OpenAI:
    """The session stack, which serves every demo LLM id beside the test models (tests/support/stack.py)."""
    return openai.OpenAI(base_url=f"{stack.edge_url}/v1", api_key="unused", max_retries=0, timeout=300)


class City(BaseModel):
    name: Literal["Paris", "Rome", "Berlin"]
    country: Literal["France", "Italy", "Germany"]
    population_millions: int = Field(ge=1, le=40)


ASK = [{"role": "user", "content": "Which city is the capital of France? Answer in JSON."}]
GREEDY: dict[str, Any] = {"temperature": 0, "max_tokens": 40}


@pytest.mark.parametrize("model", GUIDED)
def test_parse_returns_the_pydantic_object(demo_client: openai.OpenAI, model: str) -> None:
    completion = demo_client.chat.completions.parse(model=model, messages=ASK, response_format=City, **GREEDY)
    parsed = completion.choices[0].message.parsed
    assert isinstance(parsed, City) and completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("model", GUIDED)
def test_a_strict_schema_with_enums_and_bounds_always_validates(demo_client: openai.OpenAI, model: str) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["color", "count", "ok"],
              "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]},
                             "count": {"type": "integer", "minimum": 3, "maximum": 7},
                             "ok": {"type": "boolean"}}}
    response_format: Any = {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema, "strict": True}}
    prompts = ["Pick a color.", "Count to ten.", "Say hello."]
    for prompt in prompts:
        answer = demo_client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                                     response_format=response_format, **GREEDY)
        jsonschema.validate(json.loads(answer.choices[0].message.content or ""), schema)
    stream = demo_client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompts[0]}],
                                                 response_format=response_format, stream=True, **GREEDY)
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    jsonschema.validate(json.loads(text), schema)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # streamed, not at the end


@pytest.mark.parametrize("model", GUIDED)
def test_json_object_is_an_object(demo_client: openai.OpenAI, model: str) -> None:
    answer = demo_client.chat.completions.create(model=model, messages=ASK, response_format={"type": "json_object"},
                                                 temperature=0, max_tokens=24)
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)


def test_fastertransformer_refuses_formats_it_cannot_enforce(demo_client: openai.OpenAI) -> None:
    schema: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}
    for response_format in (schema, {"type": "json_object"}):
        with pytest.raises(openai.BadRequestError) as error:
            demo_client.chat.completions.create(model=FT, messages=ASK, response_format=response_format, max_tokens=5)
        assert error.value.param == "response_format" and "cannot be enforced" in error.value.message


def test_a_schema_the_grammar_compiler_rejects_is_a_400(demo_client: openai.OpenAI) -> None:
    """A valid JSON Schema that xgrammar cannot compile (a $ref to nowhere)."""
    schema: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}}}
    for model in GUIDED:
        with pytest.raises(openai.BadRequestError) as error:
            demo_client.chat.completions.create(model=model, messages=ASK, response_format=schema, max_tokens=5)
        assert error.value.param == "response_format"


WEATHER_PARAMS = {"type": "object", "additionalProperties": False, "required": ["city", "unit"],
                  "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Berlin"]},
                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}
TIME_PARAMS = {"type": "object", "additionalProperties": False, "required": ["zone"],
               "properties": {"zone": {"type": "string", "enum": ["Europe/Paris", "Europe/Rome"]}}}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                      "parameters": WEATHER_PARAMS, "strict": True}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone",
                                      "parameters": TIME_PARAMS}},
]
PARAMS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
WEATHER_QUESTION = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def check_calls(calls: list[Any], names: set[str]) -> None:
    assert calls
    for call in calls:
        assert call.id.startswith("call_") and call.type == "function" and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def streamed_calls(stream: Any) -> tuple[str, list[dict[str, str]], str | None]:
    """Content, calls (joined from their pieces) and finish reason of a stream; checks the pieces' order."""
    content, calls, reason = "", [], None
    for chunk in stream:
        if not chunk.choices:
            continue
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        for piece in choice.delta.tool_calls or []:
            if piece.index == len(calls):  # a new call: its id, type and name come first
                assert piece.id and piece.id.startswith("call_") and piece.type == "function"
                assert piece.function and piece.function.name
                calls.append({"name": piece.function.name, "arguments": piece.function.arguments or ""})
            else:
                assert piece.index == len(calls) - 1 and not piece.id
                calls[-1]["arguments"] += (piece.function.arguments if piece.function else "") or ""
        reason = choice.finish_reason or reason
    return content, calls, reason


@pytest.mark.parametrize("model", GUIDED)
def test_a_named_tool_gives_a_valid_call_streamed_and_not(demo_client: openai.OpenAI, model: str) -> None:
    answer = demo_client.chat.completions.create(model=model, messages=WEATHER_QUESTION, tools=TOOLS,
                                                 tool_choice=NAMED, **GREEDY)
    message = answer.choices[0].message
    assert answer.choices[0].finish_reason == "tool_calls" and not message.content
    check_calls(message.tool_calls or [], {"get_weather"})
    stream = demo_client.chat.completions.create(model=model, messages=WEATHER_QUESTION, tools=TOOLS,
                                                 tool_choice=NAMED, stream=True, **GREEDY)
    content, calls, reason = streamed_calls(stream)
    assert content == "" and reason == "tool_calls" and len(calls) == 1
    assert calls[0]["arguments"] == (message.tool_calls or [])[0].function.arguments  # greedy: the same call


@pytest.mark.parametrize("model", GUIDED)
def test_required_lets_the_model_choose_and_parallel_false_gives_one_call(demo_client: openai.OpenAI,
                                                                          model: str) -> None:
    answer = demo_client.chat.completions.create(model=model, messages=WEATHER_QUESTION, tools=TOOLS,
                                                 tool_choice="required", parallel_tool_calls=False, **GREEDY)
    assert answer.choices[0].finish_reason == "tool_calls"
    calls = answer.choices[0].message.tool_calls or []
    check_calls(calls, set(PARAMS))
    assert len(calls) == 1
    # With parallel calls allowed this small model goes on listing calls until max_tokens: the first is whole.
    stream = demo_client.chat.completions.create(model=model, messages=WEATHER_QUESTION, tools=TOOLS,
                                                 tool_choice="required", stream=True, **GREEDY)
    content, streamed, reason = streamed_calls(stream)
    assert content == "" and reason in ("tool_calls", "length") and streamed
    jsonschema.validate(json.loads(streamed[0]["arguments"]), PARAMS[streamed[0]["name"]])


@pytest.mark.parametrize("model", GUIDED)
def test_an_agents_second_turn_with_the_tool_result(demo_client: openai.OpenAI, model: str) -> None:
    first = demo_client.chat.completions.create(model=model, messages=WEATHER_QUESTION, tools=TOOLS,
                                                tool_choice=NAMED, **GREEDY)
    call = (first.choices[0].message.tool_calls or [])[0]
    messages: Any = [*WEATHER_QUESTION,
                     {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    second = demo_client.chat.completions.create(model=model, messages=messages, tools=TOOLS, temperature=0,
                                                 max_tokens=24)
    choice = second.choices[0]
    assert choice.finish_reason in ("stop", "length", "tool_calls")
    assert "<tool_call>" not in (choice.message.content or "")
    assert second.usage is not None and second.usage.prompt_tokens > first.usage.prompt_tokens  # type: ignore[union-attr]


def test_legacy_functions_answer_with_function_call(demo_client: openai.OpenAI) -> None:
    answer = demo_client.chat.completions.create(  # type: ignore[call-overload]
        model=GUIDED[0], messages=WEATHER_QUESTION, functions=[TOOLS[0]["function"]],
        function_call={"name": "get_weather"}, **GREEDY)
    choice = answer.choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    assert choice.message.function_call is not None and choice.message.function_call.name == "get_weather"
    jsonschema.validate(json.loads(choice.message.function_call.arguments), WEATHER_PARAMS)


def test_fastertransformer_refuses_a_forced_call_and_serves_auto(demo_client: openai.OpenAI) -> None:
    for choice in ("required", NAMED):
        with pytest.raises(openai.BadRequestError) as error:
            demo_client.chat.completions.create(model=FT, messages=WEATHER_QUESTION, tools=TOOLS, tool_choice=choice,
                                                max_tokens=5)
        assert error.value.param == "tool_choice" and "guided decoding" in error.value.message
    answer = demo_client.chat.completions.create(model=FT, messages=WEATHER_QUESTION, tools=TOOLS, **GREEDY)
    message = answer.choices[0].message
    assert "<tool_call>" not in (message.content or "")  # a call, if the model made one, is in tool_calls
    if message.tool_calls:
        assert answer.choices[0].finish_reason == "tool_calls"


# The Responses API's function tools: the same tools in its flat shape, its calls as function_call items.
RESPONSE_TOOLS: Any = [{"type": "function", **tool["function"]} for tool in TOOLS]
RESPONSE_NAMED: Any = {"type": "function", "name": "get_weather"}
WEATHER_REQUEST: Any = {"input": WEATHER_QUESTION[0]["content"], "tools": RESPONSE_TOOLS, "tool_choice": RESPONSE_NAMED,
                        "temperature": 0, "max_output_tokens": 40}


def check_call_item(item: dict[str, Any]) -> None:
    assert item["type"] == "function_call" and item["id"].startswith("fc_") and item["call_id"].startswith("call_")
    assert item["name"] == "get_weather" and item["status"] == "completed"
    jsonschema.validate(json.loads(item["arguments"]), WEATHER_PARAMS)


def test_responses_a_named_tool_gives_a_function_call_item_streamed_and_not(demo_client: openai.OpenAI) -> None:
    raw = demo_client.responses.with_raw_response.create(model=GUIDED[0], **WEATHER_REQUEST)
    body = raw.http_response.json()
    validate(body, "Response")
    assert body["status"] == "completed" and [item["type"] for item in body["output"]] == ["function_call"]
    check_call_item(body["output"][0])
    assert raw.parse().output_text == ""  # no message item: the answer is only the call
    edge = str(demo_client.base_url).removesuffix("/").removesuffix("/v1")
    with httpx.Client(base_url=edge, timeout=300) as http:
        events = stream_events(http, "/v1/responses", {"model": GUIDED[0], **WEATHER_REQUEST, "stream": True})
    payloads = [json.loads(event.data) for event in events if event.data != "[DONE]"]
    for payload in payloads:
        validate(payload, EVENT_SCHEMAS[payload["type"]])
        validate(payload, "ResponseStreamEvent")
    assert [payload["sequence_number"] for payload in payloads] == list(range(len(payloads)))
    kinds = [payload["type"] for payload in payloads]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    deltas = payloads[3:-3]
    assert len(deltas) > 1 and {payload["type"] for payload in deltas} == {"response.function_call_arguments.delta"}
    added, done, item_done, completed = payloads[2], payloads[-3], payloads[-2], payloads[-1]["response"]
    assert added["item"]["type"] == "function_call" and added["item"]["status"] == "in_progress"
    item_id = added["item"]["id"]
    assert all(p["item_id"] == item_id and p["output_index"] == 0 for p in [*deltas, done])
    assert added["output_index"] == item_done["output_index"] == 0
    arguments = "".join(payload["delta"] for payload in deltas)
    assert done["arguments"] == arguments == body["output"][0]["arguments"] and done["name"] == "get_weather"
    check_call_item(item_done["item"])
    assert completed["output"] == [item_done["item"]] and completed["status"] == "completed"


def test_responses_an_agents_turns_through_the_sdks_stream(demo_client: openai.OpenAI) -> None:
    with demo_client.responses.stream(model=GUIDED[1], **WEATHER_REQUEST) as stream:
        kinds = [event.type for event in stream]
        first = stream.get_final_response()
    assert kinds.count("response.function_call_arguments.delta") > 1
    call = first.output[0]
    assert call.type == "function_call"
    check_call_item(call.model_dump(mode="json"))
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21, "sky": "sunny"}'}
    # The stored conversation holds the call: the next turn sends only its output.
    second = demo_client.responses.create(model=GUIDED[1], input=[result], previous_response_id=first.id,
                                          tools=RESPONSE_TOOLS, temperature=0, max_output_tokens=16)
    assert second.status in ("completed", "incomplete") and second.output
    assert first.usage is not None and second.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    # Without a stored conversation, the agent sends it all back: the same prompt.
    items: Any = [{"role": "user", "content": WEATHER_REQUEST["input"]}, call.model_dump(exclude_none=True), result]
    stateless = demo_client.responses.create(model=GUIDED[1], input=items, tools=RESPONSE_TOOLS, temperature=0,
                                             max_output_tokens=1, store=False)
    assert stateless.usage is not None and stateless.usage.input_tokens == second.usage.input_tokens


def test_langchain_bind_tools_and_with_structured_output(demo_client: openai.OpenAI) -> None:
    from langchain_openai import ChatOpenAI

    def get_weather(city: Literal["Paris", "Rome", "Berlin"], unit: Literal["celsius", "fahrenheit"]) -> str:
        """The weather in a city."""
        return "sunny"

    llm = ChatOpenAI(model=GUIDED[1], base_url=str(demo_client.base_url), api_key="unused",  # type: ignore[arg-type]
                     temperature=0, max_tokens=40, max_retries=0)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What is the weather in Rome?")
    assert [call["name"] for call in message.tool_calls] == ["get_weather"]  # type: ignore[attr-defined]
    assert message.tool_calls[0]["args"]["city"] in ("Paris", "Rome", "Berlin")  # type: ignore[attr-defined]
    city = llm.with_structured_output(City).invoke("Which city is the capital of France?")
    assert isinstance(city, City)


class Weather(BaseModel):
    city: Literal["Paris", "Rome", "Berlin"]
    sunny: bool


WEATHER_FORMAT: Any = {"type": "json_schema", "json_schema": {"name": "Weather", "strict": True,
                                                              "schema": Weather.model_json_schema()}}


@pytest.mark.parametrize("model", GUIDED)
def test_a_forced_call_with_a_format_calls_then_answers_in_the_format(demo_client: openai.OpenAI, model: str) -> None:
    """The Agents SDK's pair: the forced turn is the call (the format does not bend it), the answer after the
    tool's result follows the format."""
    first = demo_client.chat.completions.create(model=model, messages=WEATHER_QUESTION, tools=TOOLS,
                                                tool_choice=NAMED, response_format=WEATHER_FORMAT, **GREEDY)
    assert first.choices[0].finish_reason == "tool_calls" and not first.choices[0].message.content
    call = (first.choices[0].message.tool_calls or [])[0]
    check_calls([call], {"get_weather"})
    messages: Any = [*WEATHER_QUESTION, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                     {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 21, "sky": "sunny"}'}]
    second = demo_client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                 response_format=WEATHER_FORMAT, temperature=0, max_tokens=40)
    assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
    Weather.model_validate_json(second.choices[0].message.content or "")


def test_responses_a_forced_call_with_a_format(demo_client: openai.OpenAI) -> None:
    text_format: Any = {"format": {"type": "json_schema", "name": "Weather", "strict": True,
                                   "schema": Weather.model_json_schema()}}
    first = demo_client.responses.create(model=GUIDED[0], text=text_format, **WEATHER_REQUEST)
    assert [item.type for item in first.output] == ["function_call"]
    check_call_item(first.output[0].model_dump(mode="json"))
    result = {"type": "function_call_output", "call_id": first.output[0].call_id,  # type: ignore[union-attr]
              "output": '{"temperature": 21, "sky": "sunny"}'}
    second = demo_client.responses.create(model=GUIDED[0], input=[result], previous_response_id=first.id,
                                          tools=RESPONSE_TOOLS, text=text_format, temperature=0, max_output_tokens=40)
    assert second.status == "completed"
    Weather.model_validate_json(second.output_text)


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
def test_the_agents_sdk_forces_a_tool_then_returns_its_output_type(demo_client: openai.OpenAI, api: str) -> None:
    """The OpenAI Agents SDK as an agent runs it: `tool_choice` forcing the tool together with the
    `output_type`'s format on the first turn, the tool's result, then the typed final answer."""
    import agents

    agents.set_tracing_disabled(True)  # its traces would go to OpenAI's servers
    sdk_client = openai.AsyncOpenAI(base_url=str(demo_client.base_url), api_key="unused", max_retries=0, timeout=300)
    model: agents.Model = (agents.OpenAIResponsesModel(GUIDED[0], sdk_client) if api == "responses"
                           else agents.OpenAIChatCompletionsModel(GUIDED[0], sdk_client))
    asked: list[str] = []

    @agents.function_tool
    def get_weather(city: Literal["Paris", "Rome", "Berlin"]) -> str:
        """The weather in a city."""
        asked.append(city)
        return f"It is sunny in {city}."

    agent = agents.Agent(name="weather", instructions="Answer with the weather.", tools=[get_weather], model=model,
                         output_type=Weather, model_settings=agents.ModelSettings(
                             tool_choice="get_weather", temperature=0, max_tokens=40))
    result = agents.Runner.run_sync(agent, "What is the weather like in Paris today?", max_turns=3)
    assert asked and asked[0] in ("Paris", "Rome", "Berlin")
    assert isinstance(result.final_output, Weather)
