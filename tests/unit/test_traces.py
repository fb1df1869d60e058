"""The two traces of docs/architecture.md, followed through the code: an embeddings request and a streamed
chat request go through the real edge app, the real llm, embed and rerank services and their Triton client,
to the fake Triton (tests/support/fake_triton.py), all in this process. Every call of the project's
functions is recorded (a profiling hook) and each trace's documented hops must come in the documented
order; the document must name every hop the test pins (but the fake Triton, which it calls Triton)."""

from __future__ import annotations

import asyncio
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

# A hop is a module, or a function of one (a call matches it when its module.qualname is the hop or starts
# with it and a dot). Each list is in the order the calls must first come, each after the one before it.
EMBEDDINGS = [
    "edge.telemetry.HttpMetrics",
    "edge.lean.LeanRoutes",
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
    "edge.generation.GenerationInput.proto",
    "edge.clients.LlmClient.generate",
    "edge.clients.ModelDirectory.route",
    "edge.many.ManyGeneration",
    "edge.many.GenerateStreams.start",
    "edge.clients.Generation.accepted",
    "services.common.metrics.MetricsInterceptor",
    "services.llm.servicer.ManyGenerations",
    "services.llm.model.LanguageModel.generate",
    "services.llm.model.LanguageModel.prompts",
    "services.llm.chat.ChatTemplate.render",
    "services.llm.params.check_request",
    "services.llm.params.sampling",
    "services.llm.params.max_new_tokens",
    "services.llm.params.for_choice",
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
    "edge.sse.EventStream",
    "edge.streaming.ChunkFraming.start",
    "edge.endpoints.chat.ChatShape.opening",
    "edge.clients.Generation.deltas",
    "edge.streaming.ChunkFraming.delta",
    "edge.endpoints.chat.ChatShape.delta",
    "edge.streaming.ChunkFraming.end",
    "edge.endpoints.chat.ChatShape.end",
    "edge.streaming.ChunkFraming.finish",
]


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


@pytest.fixture(scope="module")
async def stack(models_dir: Path) -> AsyncIterator[InProcessStack]:
    async with in_process_stack(models_dir) as running:
        yield running


@pytest.mark.parametrize(("title", "paths"), [("`POST /v1/embeddings`", [EMBEDDINGS]),
                                               ("streamed `POST /v1/chat/completions`", [CHAT, CHAT_EVENTS])])
def test_the_document_names_every_hop_the_test_pins(title: str, paths: list[list[str]]) -> None:
    section = trace_section(title)
    missing = [hop for path in paths for hop in path if not hop.startswith("tests.") and f"`{hop}" not in section]
    assert not missing, f"the trace '{title}' of docs/architecture.md does not name {missing}"


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


def test_a_hop_out_of_order_fails_the_trace() -> None:
    calls = [Call("edge.endpoints.embeddings.to_json", 1), Call("services.embed.embedder.pool", 2)]
    follow(calls, ["edge.endpoints.embeddings.to_json"])
    with pytest.raises(AssertionError, match=re.escape("no call of edge.endpoints.embeddings.to_json after")):
        follow(calls, ["services.embed.embedder.pool", "edge.endpoints.embeddings.to_json"])
