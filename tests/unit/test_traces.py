"""The four traces of docs/architecture.md, followed through the code: an embeddings request, a streamed chat
request, a streamed Messages request and a stored-Responses follow-up go through the real edge app, the real
llm, embed and rerank services and their Triton client, to the fake Triton (tests/support/fake_triton.py),
all in this process. Every call of the project's functions is recorded (a profiling hook) and each trace's
pinned hops must come in the pinned order. The document and the test check each other both ways: a trace
must name every hop the test pins (but the fake Triton, which it calls Triton), and every function a trace
names (a dotted name in `edge`, `services` or `tritongate`) must be one its request called."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest

from tests.support import fake_triton
from tests.support.fake_triton import InProcessStack, in_process_stack
from tests.support.streams import parse_events

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
OURS = ("edge", "services", "tritongate")
# A name a trace of the document gives a function, class or module of the project.
DOCUMENTED = re.compile(r"`((?:edge|services|tritongate)(?:\.\w+)+)")

# A hop is a module, or a function of one (a call matches it when its module.qualname is the hop or starts
# with it and a dot). Each list is in the order the calls must first come, each after the one before it.
EMBEDDINGS = [
    "edge.telemetry.HttpMetrics",
    "edge.lean.LeanRoutes",
    "edge.lean.until_disconnected",
    "edge.routers.embeddings.create_embeddings",
    "edge.endpoints.embeddings.to_proto",
    "edge.clients.EmbedClient.embed",
    "edge.clients.ModelDirectory.route",
    "edge.coalesce",
    "services.common.metrics.MetricsInterceptor",
    "services.common.admission.AdmissionInterceptor",
    "services.embed.servicer.EmbedServicer.Embed",
    "services.embed.embedder.Embedder.serve",
    "services.embed.embedder.Embedder.rows",
    "services.common.encoder.EncoderModel.run",
    "services.common.encoder.Batcher",
    "tritongate.batching.Batches._send",
    "services.common.encoder.EncoderModel._infer",
    "services.common.triton.Triton.infer",
    "services.common.triton_pool.TritonPool.pick",
    "tests.support.fake_triton.FakeTriton.ModelInfer",
    "services.embed.embedder.pool",
    "services.embed.embedder.Embedder.answer",
    "services.embed.embedder.normalize",
    "edge.endpoints.embeddings.to_json",
]
# The request to Triton and each token back to the edge.
CHAT = [
    "edge.telemetry.HttpMetrics",
    "edge.lean.LeanRoutes",
    "edge.routers.chat.create_chat_completion",
    "edge.endpoints.chat.generation_input",
    "edge.streaming.generate",
    "edge.streaming.run",
    "edge.generation.GenerationInput.proto",
    "edge.clients.LlmClient.generate",
    "edge.clients.ModelDirectory.route",
    "edge.many.ManyGeneration",
    "edge.many.GenerateStreams.start",
    "edge.clients.Generation.accepted",
    "services.common.metrics.MetricsInterceptor",
    "services.llm.servicer.ManyGenerations",
    "services.common.items.ItemCall.serve",
    "services.llm.model.LanguageModel.generate",
    "services.llm.model.LanguageModel.prompts",
    "services.llm.chat.ChatTemplate.render",
    "services.llm.params.check_request",
    "services.llm.plan.RequestPlan.of",
    "services.llm.params.sampling",
    "services.llm.params.max_new_tokens",
    "services.llm.plan.RequestPlan.choices",
    "services.llm.params.for_choice",
    "services.llm.plan.Choice.deltas",
    "services.llm.fastertransformer.FasterTransformer.stream",
    "services.common.triton.Triton.stream",
    "services.common.triton_pool.TritonPool.pick",
    "tests.support.fake_triton.FakeTriton.ModelStreamInfer",
    "services.llm.fastertransformer.FasterTransformer.stream",
    "services.llm.completion.Completion.add",
    "services.llm.detokenizer.Detokenizer",
    "services.llm.completion.merge",
    "edge.clients.Generation.deltas",
    "edge.streaming.ChunkFraming.delta",
    "edge.endpoints.chat.ChatShape.delta",
]
# What the edge writes, from the service's first message to the end of the stream.
CHAT_EVENTS = [
    "edge.clients.Generation.accepted",
    "edge.sse.sse_response",
    "edge.sse.EventStream",
    "edge.streaming._events",
    "edge.streaming.ChunkFraming.start",
    "edge.endpoints.chat.ChatShape.opening",
    "edge.clients.Generation.deltas",
    "edge.streaming.ChunkFraming.delta",
    "edge.endpoints.chat.ChatShape.delta",
    "edge.streaming.ChunkFraming.end",
    "edge.endpoints.chat.ChatShape.end",
    "edge.streaming.ChunkFraming.finish",
]
# Anthropic's turns into the one generation, to Triton and back.
MESSAGES = [
    "edge.telemetry.HttpMetrics",
    "edge.lean.LeanRoutes",
    "edge.endpoints.message_input.chat_messages",
    "edge.endpoints.messages.MessagesRequest._rules",
    "edge.routers.messages.create_message",
    "edge.endpoints.messages.generation_input",
    "edge.streaming.run",
    "edge.generation.GenerationInput.proto",
    "edge.clients.LlmClient.generate",
    "edge.clients.ModelDirectory.route",
    "edge.many.ManyGeneration",
    "edge.clients.Generation.accepted",
    "services.llm.servicer.ManyGenerations",
    "services.common.items.ItemCall.serve",
    "services.llm.model.LanguageModel.generate",
    "services.llm.chat.ChatTemplate.render",
    "services.llm.plan.RequestPlan.of",
    "services.llm.plan.Choice.deltas",
    "services.common.triton.Triton.stream",
    "tests.support.fake_triton.FakeTriton.ModelStreamInfer",
    "services.llm.completion.Completion.add",
    "edge.clients.Generation.deltas",
    "edge.endpoints.messages.MessageEvents.delta",
]
# Anthropic's events, from the service's first message to message_stop.
MESSAGE_EVENTS = [
    "edge.clients.Generation.accepted",
    "edge.endpoints.messages.MessageShape.events",
    "edge.endpoints.messages.event_stream",
    "edge.sse.EventStream",
    "edge.streaming._events",
    "edge.endpoints.messages.MessageEvents.start",
    "edge.endpoints.messages.MessageShape.message",
    "edge.clients.Generation.deltas",
    "edge.endpoints.messages.MessageEvents.delta",
    "edge.endpoints.messages.MessageEvents._block",
    "edge.endpoints.messages.MessageEvents.end",
    "edge.endpoints.messages.MessageEvents._close",
    "edge.endpoints.messages.MessageEvents.finish",
]
# A follow-up of a stored Response: the stored conversation read, the generation, the new Response stored.
RESPONSES = [
    "edge.telemetry.HttpMetrics",
    "edge.lean.LeanRoutes",
    "edge.endpoints.response_input.input_messages",
    "edge.endpoints.responses.ResponseRequest._check_tools",
    "edge.routers.responses.create_response",
    "edge.endpoints.responses.history",
    "edge.endpoints.responses.stored",
    "edge.state.base.Space.get",
    "edge.endpoints.responses.Stored.decoded",
    "edge.state.conversation.decode",
    "edge.endpoints.response_output.ResponseRecorder",
    "edge.endpoints.responses.generation_input",
    "edge.streaming.run",
    "edge.generation.GenerationInput.proto",
    "edge.clients.LlmClient.generate",
    "edge.clients.Generation.accepted",
    "services.llm.model.LanguageModel.generate",
    "services.llm.chat.ChatTemplate.render",
    "services.common.triton.Triton.stream",
    "tests.support.fake_triton.FakeTriton.ModelStreamInfer",
    "edge.streaming._collect",
    "edge.clients.Generation.deltas",
    "edge.endpoints.llm_common.Collected.add",
    "edge.endpoints.response_output.ResponseRecorder.response",
    "edge.endpoints.response_items.output_items",
    "edge.endpoints.response_output.ResponseRecorder.finished",
    "edge.endpoints.response_items.assistant_message",
    "edge.endpoints.response_output.ResponseRecorder.persist",
    "edge.endpoints.responses.Stored.encoded",
    "edge.state.conversation.encode",
    "edge.state.base.Space.put",
]

# Each trace of the document (the title of its section) and the lists of hops the test pins in it.
EMBEDDINGS_TRACE = "`POST /v1/embeddings`"
CHAT_TRACE = "streamed `POST /v1/chat/completions`"
MESSAGES_TRACE = "streamed `POST /v1/messages`"
RESPONSES_TRACE = "stored Responses follow-up, `POST /v1/responses` with `previous_response_id`"
TRACES = {EMBEDDINGS_TRACE: [EMBEDDINGS], CHAT_TRACE: [CHAT, CHAT_EVENTS], MESSAGES_TRACE: [MESSAGES, MESSAGE_EVENTS],
          RESPONSES_TRACE: [RESPONSES]}


@dataclass
class Call:
    name: str  # module.qualname
    task: int  # id of the asyncio task it ran in (0: none)


@contextmanager
def recorded() -> Iterator[list[Call]]:
    """Every call of a function of the project (and of the fake Triton) while the block runs, in order."""
    calls: list[Call] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module.partition(".")[0] in OURS or module == fake_triton.__name__:
            try:
                task = id(asyncio.current_task())
            except RuntimeError:  # a thread without a loop
                task = 0
            calls.append(Call(f"{module}.{frame.f_code.co_qualname}", task))

    sys.setprofile(profile)
    threading.setprofile(profile)
    try:
        yield calls
    finally:
        sys.setprofile(None)
        threading.setprofile(None)


def matches(call: Call, hop: str) -> bool:
    return call.name == hop or call.name.startswith(hop + ".")


def follow(calls: list[Call], path: list[str]) -> list[Call]:
    """The call of each hop of `path`: the first that matches it after the previous hop's."""
    found: list[Call] = []
    at = 0
    for hop in path:
        at = next((i for i in range(at, len(calls)) if matches(calls[i], hop)), -1)
        if at < 0:
            after = f" after {path[len(found) - 1]}" if found else ""
            raise AssertionError(f"no call of {hop}{after}; the calls were:\n" + "\n".join(
                call.name for call in calls if "<" not in call.name))
        found.append(calls[at])
    return found


def trace_section(title: str) -> str:
    """The text of the `## Trace ...: <title>` section of docs/architecture.md."""
    text = ARCHITECTURE.read_text()
    found = re.search(rf"^## Trace \d+: {re.escape(title)}\n(.*?)(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert found, f"docs/architecture.md has no section 'Trace: {title}'"
    return found.group(1)


def documented_hops(section: str) -> list[str]:
    """The functions, classes and modules of the project a trace names (in full, in backticks), in order."""
    return list(dict.fromkeys(DOCUMENTED.findall(section)))


def check_named(title: str, paths: list[list[str]], section: str) -> None:
    """The trace names every hop the test pins (but the fake Triton's)."""
    missing = [hop for path in paths for hop in path if not hop.startswith("tests.") and f"`{hop}" not in section]
    assert not missing, f"the trace '{title}' of docs/architecture.md does not name {missing}"


def check_taken(title: str, calls: list[Call], section: str) -> None:
    """Every hop the trace names is one its request took: some call matches it."""
    # A call matches a hop that is its name or a dotted start of it.
    taken = {".".join(parts[:i]) for parts in {tuple(call.name.split(".")) for call in calls}
             for i in range(1, len(parts) + 1)}
    untaken = [hop for hop in documented_hops(section) if hop not in taken]
    assert not untaken, f"the trace '{title}' of docs/architecture.md names {untaken}, which the request did not call"


def prompt_text(stack: InProcessStack) -> str:
    """The prompt of the last request the fake Triton got (FasterTransformer's interface), as the model's
    tokenizer reads it."""
    request = stack.triton.requests[-1]
    ids = request.inputs["input_ids"].reshape(-1)[: int(request.inputs["input_lengths"].reshape(-1)[0])]
    model = stack.services["llm"].servicer.models.get(request.model)
    return str(model.tokenizer.decode(ids.tolist()))


@pytest.fixture(scope="module")
async def stack(models_dir: Path) -> AsyncIterator[InProcessStack]:
    async with in_process_stack(models_dir) as running:
        yield running


@pytest.mark.parametrize(("title", "paths"), TRACES.items(), ids=["embeddings", "chat", "messages", "responses"])
def test_the_document_names_every_hop_the_test_pins(title: str, paths: list[list[str]]) -> None:
    check_named(title, paths, trace_section(title))


async def test_an_embeddings_request_follows_the_documented_path(stack: InProcessStack) -> None:
    body = {"model": "all-minilm-l6-v2", "input": ["the capital of France", "a cat"]}
    with recorded() as calls:
        response = await stack.edge.post("/v1/embeddings", json=body)
    assert response.status_code == 200, response.text
    vectors = np.array([item["embedding"] for item in response.json()["data"]])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-5)
    hops = dict(zip(EMBEDDINGS, follow(calls, EMBEDDINGS), strict=True))
    # Pooling runs in the task that made the Triton call (the batch's), not where the answer is built.
    pooled = {call.task for call in calls if matches(call, "services.embed.embedder.pool")}
    inferred = {call.task for call in calls if matches(call, "services.common.triton.Triton.infer")}
    assert pooled and pooled <= inferred
    assert hops["services.embed.embedder.Embedder.answer"].task not in pooled
    assert stack.triton.requests[-1].model == "all-minilm-l6-v2"
    assert stack.triton.requests[-1].request_id == response.headers["x-request-id"]  # the id reaches Triton
    check_taken(EMBEDDINGS_TRACE, calls, trace_section(EMBEDDINGS_TRACE))


async def test_a_streamed_chat_request_follows_the_documented_path(stack: InProcessStack) -> None:
    body = {"model": "ft-echo", "messages": [{"role": "user", "content": "Say hi"}], "stream": True, "max_tokens": 4,
            "stream_options": {"include_usage": True}}
    with recorded() as calls:
        response = await stack.edge.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    events = parse_events(response.text)
    assert events[-1].data == "[DONE]"
    follow(calls, CHAT)
    follow(calls, CHAT_EVENTS)
    request = stack.triton.requests[-1]
    assert request.model == "ft-echo" and request.request_id.endswith("-0")  # <request id>-<choice>
    assert int(request.inputs["request_output_len"].reshape(-1)[0]) == 4
    check_taken(CHAT_TRACE, calls, trace_section(CHAT_TRACE))


async def test_a_streamed_messages_request_follows_the_documented_path(stack: InProcessStack) -> None:
    body = {"model": "ft-echo", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Say hi"}]}
    with recorded() as calls:
        response = await stack.edge.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    events = parse_events(response.text)
    names = [event.name for event in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"], names
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"], names
    assert "[DONE]" not in [event.data for event in events]  # Anthropic's streams end without it
    assert json.loads(events[-2].data)["delta"]["stop_reason"] == "max_tokens"
    follow(calls, MESSAGES)
    follow(calls, MESSAGE_EVENTS)
    request = stack.triton.requests[-1]
    assert request.model == "ft-echo" and int(request.inputs["request_output_len"].reshape(-1)[0]) == 4
    check_taken(MESSAGES_TRACE, calls, trace_section(MESSAGES_TRACE))


async def test_a_stored_responses_follow_up_follows_the_documented_path(stack: InProcessStack) -> None:
    first = await stack.edge.post("/v1/responses", json={"model": "ft-echo", "input": "Say hi", "max_output_tokens": 4})
    assert first.status_code == 200, first.text
    first_prompt, answer = prompt_text(stack), first.json()["output"][0]["content"][0]["text"]
    body = {"model": "ft-echo", "input": "And again", "previous_response_id": first.json()["id"],
            "max_output_tokens": 4}
    with recorded() as calls:
        response = await stack.edge.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["previous_response_id"] == first.json()["id"]
    follow(calls, RESPONSES)
    # The model read the stored conversation: the first request's prompt, its answer, then the new input.
    prompt = prompt_text(stack)
    assert prompt.startswith(first_prompt) and prompt[len(first_prompt):].startswith(answer), prompt
    assert "And again" in prompt[len(first_prompt) + len(answer):]
    check_taken(RESPONSES_TRACE, calls, trace_section(RESPONSES_TRACE))


def test_a_hop_out_of_order_fails_the_trace() -> None:
    calls = [Call("edge.endpoints.embeddings.to_json", 1), Call("services.embed.embedder.pool", 2)]
    follow(calls, ["edge.endpoints.embeddings.to_json"])
    with pytest.raises(AssertionError, match=re.escape("no call of edge.endpoints.embeddings.to_json after")):
        follow(calls, ["services.embed.embedder.pool", "edge.endpoints.embeddings.to_json"])


def test_a_trace_that_names_a_hop_the_code_no_longer_takes_fails() -> None:
    section = trace_section(EMBEDDINGS_TRACE)
    calls = [Call(f"{hop}.__call__", 1) for hop in documented_hops(section)]
    check_taken(EMBEDDINGS_TRACE, calls, section)
    renamed = section + "\n7. `edge.coalesce.Coalescer.no_such_hop` answers it.\n"
    with pytest.raises(AssertionError, match=re.escape("names ['edge.coalesce.Coalescer.no_such_hop'], which")):
        check_taken(EMBEDDINGS_TRACE, calls, renamed)


def test_a_trace_that_misses_a_pinned_hop_fails() -> None:
    section = trace_section(EMBEDDINGS_TRACE)
    check_named(EMBEDDINGS_TRACE, [EMBEDDINGS], section)
    with pytest.raises(AssertionError, match=re.escape("does not name ['edge.coalesce.Coalescer.no_such_hop']")):
        check_named(EMBEDDINGS_TRACE, [[*EMBEDDINGS, "edge.coalesce.Coalescer.no_such_hop"]], section)
