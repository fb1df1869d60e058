"""Each response shape is written twice: the schema class that /openapi.json declares (`ResponseModel`
subclasses in edge/endpoints/) and the builder the hot path writes bytes with. Here every builder runs on
protos built in the test, across its variants, and each output must be exactly its schema class (strict
types, no field missing, none extra), and OpenAI's published schema where OpenAI has one. Every
`ResponseModel` subclass must be met by some output, so a new shape cannot go unchecked."""

from __future__ import annotations

import asyncio
import base64
import importlib
import json
import pkgutil
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, get_args

import numpy as np
import orjson
import pytest
from pydantic import BaseModel, TypeAdapter

import edge.endpoints
from edge.app_state import Sessions
from edge.endpoints import (
    chat,
    completions,
    embeddings,
    interactive,
    message_schemas,
    messages,
    models,
    rerank,
    response_output,
    response_schemas,
    responses,
    tei,
    tokenize,
)
from edge.endpoints.common import ResponseModel
from edge.endpoints.llm_common import Collected, Shape
from edge.errors import OpenAIError
from edge.state import Limits
from edge.state.memory import MemoryStore
from edge.streaming import ChunkFraming, Framing
from tests.support import anthropic_schema
from tests.support.openai_schema import validate
from tests.support.streams import parse_events, validate_completion_chunk
from tritongate.common.v1 import common_pb2, tokenizer_pb2
from tritongate.embed.v1 import embed_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.rerank.v1 import rerank_pb2

HEAD = {"id": "x-1", "object": "?", "created": 1700000000, "model": "m"}
USAGE = common_pb2.Usage(prompt_tokens=5, completion_tokens=7, total_tokens=12)


@dataclass
class Case:
    """One output of a builder: `payload` (parsed JSON) must be exactly `schema`, and OpenAI's `openai`."""

    name: str
    schema: type[BaseModel] | TypeAdapter[Any]
    payload: Any
    openai: str | Callable[[Any], None] | None = None


# What the generation endpoints get from the llm service.

def logprob(token: str, value: float, offset: int, alternatives: int) -> llm_pb2.TokenLogprob:
    top = [llm_pb2.TopLogprob(token=f"{token}{i}", logprob=value - i, bytes=f"{token}{i}".encode())
           for i in range(alternatives)]
    return llm_pb2.TokenLogprob(token=token, logprob=value, bytes=token.encode(), text_offset=offset,
                                top_logprobs=top)


def text_deltas(index: int, finish_reason: str, logprobs: bool) -> list[llm_pb2.Delta]:
    pieces = ["Hel", "lo", " wörld"]
    return [*(llm_pb2.Delta(index=index, text=piece, logprobs=[logprob(piece, -0.5 * i, 3 * i, i)] if logprobs else [])
              for i, piece in enumerate(pieces)),
            llm_pb2.Delta(index=index, finish_reason=finish_reason)]


CALLS = [
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=0, id="call_a", name="weather", arguments='{"city":')]),
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=0, arguments=' "Paris"}'),
                              llm_pb2.ToolCallDelta(index=1, id="call_b", name="time", arguments="{}")]),
    llm_pb2.Delta(finish_reason="tool_calls"),
]
TEXT_THEN_CALL = [llm_pb2.Delta(text="Let me look."), *CALLS]
# A reasoning model: thinking, then the answer (or a call); and one cut by max_tokens while thinking.
THINKING = [llm_pb2.Delta(reasoning="The user "), llm_pb2.Delta(reasoning="greets me.")]
# Its usage has every detail: the thinking's tokens, and prompt tokens the backend took from its cache.
REASONED = common_pb2.Usage(prompt_tokens=5, completion_tokens=7, total_tokens=12, reasoning_tokens=4,
                            cached_tokens=3)


@dataclass
class Generation:
    """One generation's stream as the service sends it: how many choices, their deltas in order."""

    name: str
    choices: int
    deltas: list[llm_pb2.Delta]


GENERATIONS = [
    Generation("text", 1, text_deltas(0, "stop", logprobs=False)),
    Generation("length", 1, text_deltas(0, "length", logprobs=False)),
    Generation("n=2", 2, [d for pair in zip(text_deltas(0, "stop", False), text_deltas(1, "length", False),
                                            strict=True) for d in pair]),
    Generation("empty", 1, [llm_pb2.Delta(finish_reason="stop")]),
]
WITH_LOGPROBS = [Generation("logprobs", 1, text_deltas(0, "stop", logprobs=True)),
                 Generation("logprobs n=2", 2, [*text_deltas(0, "stop", True), *text_deltas(1, "length", True)])]
WITH_CALLS = [Generation("calls", 1, CALLS), Generation("text then calls", 1, TEXT_THEN_CALL)]
WITH_REASONING = [Generation("thinking then text", 1, [*THINKING, *text_deltas(0, "stop", logprobs=False)]),
                  Generation("thinking then calls", 1, [*THINKING, *CALLS]),
                  Generation("thinking cut", 1, [*THINKING, llm_pb2.Delta(finish_reason="length")])]


def collected(generation: Generation) -> list[Collected]:
    choices = [Collected() for _ in range(generation.choices)]
    for delta in generation.deltas:
        choices[delta.index].add(delta)
    return choices


def framed(framing: Framing, generation: Generation, usage: common_pb2.Usage = USAGE) -> Iterator[bytes]:
    """What the generation path writes for `generation` (a delta with content, then each finish)."""
    yield from framing.start(llm_pb2.Accepted(prompt_tokens=USAGE.prompt_tokens, choices=generation.choices))
    for delta in generation.deltas:
        if delta.text or delta.reasoning or delta.logprobs or delta.tool_calls:
            yield from framing.delta(delta)
        if delta.finish_reason:
            yield from framing.end(delta.index, delta.finish_reason, delta.stop_string)
    yield from framing.finish(usage)


def sse_payloads(events: Iterable[bytes]) -> list[tuple[str | None, Any]]:
    """Each event's name and JSON, from the bytes as they go to the client."""
    parsed = parse_events(b"".join(events).decode())
    assert parsed, "no events"
    return [(event.name, json.loads(event.data)) for event in parsed]


def chunk_cases(name: str, shape: Shape, generation: Generation, model: type[ResponseModel],
                openai: str | Callable[[Any], None], usage: common_pb2.Usage = USAGE) -> Iterator[Case]:
    """The stream chunks `shape` gives `generation`, without and with the usage chunk."""
    for include_usage in (False, True):
        framing = ChunkFraming(shape, {**HEAD, "object": shape.object}, include_usage)
        for i, (event, payload) in enumerate(sse_payloads(framed(framing, generation, usage))):
            assert event is None
            yield Case(f"{name}{' include_usage' if include_usage else ''}: chunk {i}", model, payload, openai)


def chat_cases() -> Iterator[Case]:
    variants = [(g, False, False) for g in GENERATIONS] + [(g, True, False) for g in WITH_LOGPROBS] + \
               [(g, False, legacy) for g in WITH_CALLS for legacy in (False, True)]
    for generation, logprobs, legacy in variants:
        shape = chat.ChatShape(logprobs, legacy_functions=legacy)
        name = f"chat {generation.name}{' legacy functions' if legacy else ''}"
        yield Case(f"{name}: response", chat.ChatCompletion, shape.response(HEAD, collected(generation), USAGE),
                   "CreateChatCompletionResponse")
        yield from chunk_cases(name, shape, generation, chat.ChatCompletionChunk, "CreateChatCompletionStreamResponse")
    for generation in WITH_REASONING:
        for field in get_args(chat.ReasoningField):
            shape = chat.ChatShape(False, reasoning_field=field)
            name = f"chat {generation.name} as {field}"
            yield Case(f"{name}: response", chat.ChatCompletion,
                       shape.response(HEAD, collected(generation), REASONED), "CreateChatCompletionResponse")
            yield from chunk_cases(name, shape, generation, chat.ChatCompletionChunk,
                                   "CreateChatCompletionStreamResponse", REASONED)


def completion_cases() -> Iterator[Case]:
    for generation, logprobs in [(g, False) for g in GENERATIONS] + [(g, True) for g in WITH_LOGPROBS]:
        shape = completions.CompletionShape(logprobs)
        name = f"completion {generation.name}"
        yield Case(f"{name}: response", completions.Completion, shape.response(HEAD, collected(generation), USAGE),
                   "CreateCompletionResponse")
        yield from chunk_cases(name, shape, generation, completions.Completion, validate_completion_chunk)


RESPONSE_REQUESTS = {
    "plain": {"model": "m", "input": "hi"},
    "everything": {"model": "m", "input": [{"role": "user", "content": "weather?"}], "instructions": "Be brief.",
                   "max_output_tokens": 50, "temperature": 0.5, "top_p": 0.9, "store": False, "user": "u",
                   "metadata": {"k": "v"}, "parallel_tool_calls": False, "tool_choice": "auto",
                   "text": {"format": {"type": "json_object"}},
                   "tools": [{"type": "function", "name": "weather", "parameters": {"type": "object"}}],
                   "reasoning": {"effort": "low", "summary": "auto"}},
}


# A coding agent's request (Codex CLI's fields): a custom tool with a grammar, a namespace of a function and a
# custom tool, a hosted tool, encrypted reasoning, and the fields a Response echoes.
AGENT_TOOLS = [
    {"type": "function", "name": "exec_command", "strict": False, "parameters": {"type": "object"}},
    {"type": "custom", "name": "apply_patch", "description": "Edit files.",
     "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "close_agent", "parameters": {"type": "object"}},
        {"type": "custom", "name": "note", "format": {"type": "text"}}]},
    {"type": "web_search", "external_web_access": False},
]
RESPONSE_REQUESTS["agent"] = {
    "model": "m", "input": "patch it", "tools": AGENT_TOOLS, "tool_choice": "auto", "parallel_tool_calls": True,
    "include": ["reasoning.encrypted_content"], "reasoning": {"summary": "auto"}, "store": False,
    "prompt_cache_key": "k-1", "safety_identifier": "s-1", "service_tier": "auto", "truncation": "auto",
    "text": {"verbosity": "low"}, "max_tool_calls": 8, "client_metadata": {"turn_id": "t-1"}}
# Calls of a custom tool (its raw input in pieces), a namespace's function and a namespace's custom tool.
AGENT_CALLS = [
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=0, id="call_p", name="apply_patch",
                                                    arguments="*** Begin Patch\n")]),
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=0, arguments="*** End Patch"),
                              llm_pb2.ToolCallDelta(index=1, id="call_c", name="multi_agent_v1.close_agent",
                                                    arguments='{"target": "a1"}')]),
    llm_pb2.Delta(tool_calls=[llm_pb2.ToolCallDelta(index=2, id="call_n", name="multi_agent_v1.note",
                                                    arguments="remember")]),
    llm_pb2.Delta(finish_reason="tool_calls"),
]
WITH_AGENT_CALLS = [Generation("agent calls", 1, AGENT_CALLS),
                    Generation("thinking then agent calls", 1, [*THINKING, *AGENT_CALLS]),
                    Generation("custom call cut", 1, [*AGENT_CALLS[:1], llm_pb2.Delta(finish_reason="length")])]


def response_generations(request_name: str) -> list[Generation]:
    common = [*GENERATIONS[:2], GENERATIONS[3], *WITH_CALLS, *WITH_REASONING]
    return [*common, *WITH_AGENT_CALLS] if request_name == "agent" else common


def failed_stream(recorder: response_output.ResponseRecorder, head: dict[str, Any], error: OpenAIError
                  ) -> Iterator[bytes]:
    """A stream that fails after its first call's first piece (the llm service gone, or overloaded)."""
    events = recorder.events(head)
    yield from events.start(llm_pb2.Accepted(prompt_tokens=USAGE.prompt_tokens, choices=1))
    yield from events.delta(AGENT_CALLS[0])
    yield recorder.failed(error, "/v1/responses")


def responses_cases() -> Iterator[Case]:
    store = MemoryStore().space("responses", Limits(10, 60))
    for request_name, request in RESPONSE_REQUESTS.items():
        for generation in response_generations(request_name):
            name = f"response {request_name} {generation.name}"
            body = responses.ResponseRequest.model_validate(request)
            recorder = response_output.ResponseRecorder(body, [], store)
            head = {**HEAD, "object": recorder.object}
            usage = REASONED if generation in WITH_REASONING or request_name == "agent" else USAGE
            yield Case(f"{name}: response", response_schemas.Response,
                       recorder.response(head, collected(generation), usage), "Response")
            for i, (event, payload) in enumerate(sse_payloads(framed(recorder.events(head), generation, usage))):
                assert event == payload["type"]
                yield Case(f"{name}: event {i} {event}", response_schemas.ResponseStreamEvent, payload,
                           "ResponseStreamEvent")
    body = responses.ResponseRequest.model_validate(RESPONSE_REQUESTS["agent"])
    for error in (OpenAIError(503, "The llm service is unavailable."), OpenAIError(429, "Overloaded.")):
        recorder = response_output.ResponseRecorder(body, [], store)
        for i, (event, payload) in enumerate(sse_payloads(failed_stream(recorder, HEAD, error))):
            yield Case(f"response failed {error.status}: event {i} {event}", response_schemas.ResponseStreamEvent,
                       payload, "ResponseStreamEvent")


THINKING = [llm_pb2.Delta(reasoning="Hmm, "), llm_pb2.Delta(reasoning="Paris.", text="It is"),
            llm_pb2.Delta(text=" Paris."), llm_pb2.Delta(finish_reason="stop")]
MESSAGE_GENERATIONS = [*GENERATIONS[:2], GENERATIONS[3], *WITH_CALLS, Generation("thinking", 1, THINKING),
                       Generation("stop string", 1, [llm_pb2.Delta(text="1, 2"),
                                                     llm_pb2.Delta(finish_reason="stop", stop_string=", 3")])]


# A beta request's answer (Claude Code's): thinking not shown (`display: omitted`), the context edits it
# asked for reported, prompt tokens from the backend's cache counted.
APPLIED = [{"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 0},
           {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": 0}]
MESSAGE_SHAPES = [("", messages.MessageShape(), USAGE),
                  (" (beta)", messages.MessageShape(thinking_shown=False, applied_edits=APPLIED), REASONED)]


def messages_cases() -> Iterator[Case]:
    """Anthropic's Message, stream events, token count and error, also against its published shapes."""
    for variant, shape, usage in MESSAGE_SHAPES:
        head = {**HEAD, "object": shape.object}
        for generation in MESSAGE_GENERATIONS:
            name = f"message{variant} {generation.name}"
            yield Case(f"{name}: response", message_schemas.Message,
                       shape.response(head, collected(generation), usage), anthropic_schema.validate_message)
            for i, (event, payload) in enumerate(sse_payloads(framed(shape.events(head), generation, usage))):
                assert event == payload["type"]
                yield Case(f"{name}: event {i} {event}", message_schemas.MessageStreamEvent, payload,
                           anthropic_schema.validate_event)
    yield Case("message token count", message_schemas.TokenCount, messages.token_count(12),
               anthropic_schema.validate_count)
    for status in (400, 401, 404, 413, 429, 500, 503, 504):
        yield Case(f"message error {status}", message_schemas.AnthropicError,
                   OpenAIError(status, "refused").body("/v1/messages"), anthropic_schema.validate_error)


def embedding_cases() -> Iterator[Case]:
    vectors = np.array([[0.25, -1.5, 3.0], [1e-8, 0.0, -2.75]], dtype="<f4")
    answer = embed_pb2.EmbedResponse(model="e", embeddings=vectors.tobytes(), rows=2, dimensions=3,
                                     usage=common_pb2.Usage(prompt_tokens=4, total_tokens=4))
    floats = orjson.loads(embeddings.to_json(answer, "float"))
    assert np.array_equal(np.array([item["embedding"] for item in floats["data"]], dtype="<f4"), vectors)
    yield Case("embeddings float", embeddings.CreateEmbeddingResponse, floats, "CreateEmbeddingResponse")
    encoded = orjson.loads(embeddings.to_json(answer, "base64"))
    assert [np.frombuffer(base64.b64decode(item["embedding"]), "<f4").tolist() for item in encoded["data"]] == \
        vectors.tolist()
    yield Case("embeddings base64", embeddings.CreateEmbeddingResponse, encoded)  # OpenAI's schema: floats only


def rerank_cases() -> Iterator[Case]:
    answer = rerank_pb2.RerankResponse(model="r", results=[rerank_pb2.RerankResult(index=1, score=0.75),
                                                           rerank_pb2.RerankResult(index=0, score=0.125)],
                                       usage=common_pb2.Usage(prompt_tokens=9, total_tokens=9))
    for documents in (False, True):
        body = rerank.RerankRequest.model_validate({"model": "r", "query": "q", "documents": ["a", {"text": "b"}],
                                                    "return_documents": documents})
        yield Case(f"rerank documents={documents}", rerank.RerankResponse,
                   orjson.loads(orjson.dumps(rerank.response(body, answer))))
    for text in (False, True):
        tei = rerank.TEIRerankRequest.model_validate({"query": "q", "texts": ["a", "b"], "return_text": text})
        yield Case(f"rerank TEI return_text={text}", TypeAdapter(rerank.TEIRerankResponse),
                   orjson.loads(orjson.dumps(rerank.tei_response(tei, answer))))
    yield Case("NIM ranking", rerank.RankingResponse, orjson.loads(orjson.dumps(rerank.ranking_response(answer))))


def tei_cases() -> Iterator[Case]:
    vectors = np.array([[0.5, -1.0], [0.25, 2.0]], dtype="<f4")
    answer = embed_pb2.EmbedResponse(model="e", embeddings=vectors.tobytes(), rows=2, dimensions=2)
    embedded = orjson.loads(tei.embed_json(answer))
    assert embedded == vectors.tolist()
    yield Case("TEI embed", tei.TEIEmbedResponse, embedded)
    spans = [tokenizer_pb2.TokenSpan(text="[CLS]", special=True), tokenizer_pb2.TokenSpan(text="hi", start=0, stop=2)]
    tokens = tei.tokens(tokenizer_pb2.TokenizeResponse(tokens=[101, 7632], spans=spans))
    assert [t["start"] for t in tokens] == [None, 0]
    yield Case("TEI tokenize", TypeAdapter(tei.TEITokenizeResponse), [tokens])
    for kind in (common_pb2.MODEL_KIND_EMBEDDING, common_pb2.MODEL_KIND_RERANK):
        card = common_pb2.ModelCard(id="m", kind=kind, max_model_len=256)
        yield Case(f"TEI info {kind}", tei.TEIInfo, tei.info(card, 32))


def model_cases() -> Iterator[Case]:
    cards = [common_pb2.ModelCard(id="llm", kind=common_pb2.MODEL_KIND_LLM, created=1, max_model_len=2048),
             common_pb2.ModelCard(id="embed", kind=common_pb2.MODEL_KIND_EMBEDDING, created=2)]
    yield Case("models list", models.ListModelsResponse, models.model_list(cards), "ListModelsResponse")
    for card in cards:
        yield Case(f"model {card.id}", models.Model, models.model_object(card), "Model")


def tokenize_cases() -> Iterator[Case]:
    yield Case("tokenize", tokenize.TokenizeResponse,
               tokenize.tokenized(tokenizer_pb2.TokenizeResponse(tokens=[1, 2, 3], max_model_len=512)))
    yield Case("detokenize", tokenize.DetokenizeResponse,
               tokenize.detokenized(tokenizer_pb2.DetokenizeResponse(prompt="hi")))


def _lines(body: bytes) -> list[Any]:
    return [json.loads(line) for line in body.split(b"\n") if line]


async def streamed(turn: interactive.Turn, generation: Generation, failure: Exception | None = None) -> list[Any]:
    """The lines a streamed turn writes (through the endpoint's own `respond`), failing after the first
    piece of text when told to."""

    async def lines() -> AsyncIterator[bytes]:
        for i, line in enumerate(framed(turn.lines(HEAD), generation)):
            if failure is not None and i == 1:
                raise failure
            yield line

    response = interactive.json_lines(turn)(lines(), 1.0)
    return _lines(b"".join([chunk async for chunk in response.body_iterator]))


async def interactive_cases() -> list[Case]:
    sessions = Sessions(MemoryStore().space("sessions", Limits(10, 60)),
                                    MemoryStore().space("cancels", Limits(10, 60)))
    session = interactive.Session("m", [llm_pb2.ChatMessage(role="user", content="before")], tokens=3)

    def turn(stream: bool) -> interactive.Turn:
        body = interactive.InteractiveRequest.model_validate({"prompt": "hi", "session_id": 7, "stream": stream})
        return interactive.Turn(body, 7, session, sessions, longest_s=1.0)

    cancel = interactive.InteractiveRequest.model_validate({"prompt": "", "session_id": 7, "cancel": True})
    cases = [Case("interactive cancel", interactive.InteractiveResponse, await interactive.cancel(cancel, sessions)),
             Case("interactive end of session", interactive.InteractiveResponse,
                  interactive.answer("", 7, history_tokens=3))]
    for generation in GENERATIONS[:2]:
        cases.append(Case(f"interactive {generation.name}: answer", interactive.InteractiveResponse,
                          turn(False).response(HEAD, collected(generation), USAGE)))
        for i, line in enumerate(await streamed(turn(True), generation)):
            cases.append(Case(f"interactive {generation.name}: line {i}", interactive.InteractiveResponse, line))
    failed = await streamed(turn(True), GENERATIONS[0], OpenAIError(503, "The llm service is unavailable."))
    assert failed[-1]["finish_reason"] == "error"
    cases += [Case(f"interactive failed stream: line {i}", interactive.InteractiveResponse, line)
              for i, line in enumerate(failed)]
    cancelled = turn(True)
    cancelled.cancelled = True
    cases += [Case("interactive cancelled stream", interactive.InteractiveResponse, line)
              for line in await streamed(cancelled, GENERATIONS[0])]
    return cases


@pytest.fixture(scope="module")
def cases() -> list[Case]:
    return [*chat_cases(), *completion_cases(), *responses_cases(), *messages_cases(), *embedding_cases(),
            *rerank_cases(), *tei_cases(), *model_cases(), *tokenize_cases(), *asyncio.run(interactive_cases())]


def exactly(schema: type[BaseModel] | TypeAdapter[Any], payload: Any) -> Any:
    """`payload` validated by `schema` in strict mode; it must also hold exactly the schema's fields (the
    classes ignore extras, so the validated value, dumped, must give back the payload)."""
    if isinstance(schema, TypeAdapter):
        value = schema.validate_python(payload, strict=True)
        dumped = schema.dump_python(value, mode="json", exclude_unset=True)
    else:
        value = schema.model_validate(payload, strict=True)
        dumped = value.model_dump(mode="json", exclude_unset=True)
    assert dumped == payload, f"fields the schema does not declare: {_difference(payload, dumped)}"
    return value


def _difference(payload: Any, dumped: Any, path: str = "") -> list[str]:
    if isinstance(payload, dict) and isinstance(dumped, dict):
        return [f"{path}.{key}" for key in payload.keys() - dumped.keys()] + [
            d for key in payload.keys() & dumped.keys()
            for d in _difference(payload[key], dumped[key], f"{path}.{key}")]
    if isinstance(payload, list) and isinstance(dumped, list) and len(payload) == len(dumped):
        return [d for i, (a, b) in enumerate(zip(payload, dumped, strict=True))
                for d in _difference(a, b, f"{path}[{i}]")]
    return [] if payload == dumped else [f"{path}: {payload!r} != {dumped!r}"]


def models_in(value: Any) -> Iterator[BaseModel]:
    """Every model instance inside a validated value."""
    if isinstance(value, BaseModel):
        yield value
        for field in type(value).model_fields:
            yield from models_in(getattr(value, field))
        if hasattr(value, "root"):
            yield from models_in(value.root)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from models_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from models_in(item)


def response_models() -> set[type[BaseModel]]:
    """Every ResponseModel subclass of every endpoint module."""
    for module in pkgutil.iter_modules(edge.endpoints.__path__):
        importlib.import_module(f"edge.endpoints.{module.name}")
    found: set[type[BaseModel]] = set()
    pending: list[type[BaseModel]] = [ResponseModel]
    while pending:
        for sub in pending.pop().__subclasses__():
            if sub not in found:
                found.add(sub)
                pending.append(sub)
    return found


def test_every_builder_output_is_exactly_its_schema_and_openais(cases: list[Case]) -> None:
    for case in cases:
        try:
            exactly(case.schema, case.payload)
            if isinstance(case.openai, str):
                validate(case.payload, case.openai)
            elif case.openai is not None:
                case.openai(case.payload)
        except Exception as exc:
            raise AssertionError(f"{case.name}: {exc}\n{json.dumps(case.payload, indent=1)[:3000]}") from exc


def test_every_response_model_is_met_by_some_builder_output(cases: list[Case]) -> None:
    met = {cls for case in cases for model in models_in(exactly(case.schema, case.payload))
           for cls in type(model).__mro__}
    unmet = sorted(cls.__qualname__ for cls in response_models() - met)
    assert not unmet, f"schema classes that no builder output in this test meets: {unmet}"


def test_the_check_refuses_an_extra_a_missing_or_a_mistyped_field() -> None:
    choice = {"index": 0, "delta": {"content": "x"}, "logprobs": None, "finish_reason": None}
    chunk = {**HEAD, "object": "chat.completion.chunk", "choices": [choice]}
    exactly(chat.ChatCompletionChunk, chunk)
    with pytest.raises(AssertionError, match="choices"):
        exactly(chat.ChatCompletionChunk, {**chunk, "choices": [{**choice, "extra": 1}]})
    with pytest.raises(ValueError, match="finish_reason"):
        exactly(chat.ChatCompletionChunk, {**chunk, "choices": [{"index": 0, "delta": {}, "logprobs": None}]})
    with pytest.raises(ValueError, match="created"):
        exactly(chat.ChatCompletionChunk, {**chunk, "created": "1700000000"})
