"""Optional OpenTelemetry tracing, in a child process (the instrumentation patches grpc.aio for good):
an HTTP request through the edge's middleware and a gRPC call from an edge-like client to a service-like
server, spans kept in memory."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("opentelemetry.sdk")

# The end of each script: every finished span, as one JSON line.
SPANS = textwrap.dedent('''
    provider.force_flush()
    print(json.dumps([{"name": s.name, "kind": s.kind.name, "trace": s.context.trace_id, "id": s.context.span_id,
                       "parent": s.parent.span_id if s.parent else None,
                       "request_id": s.attributes.get("tritongate.request_id")}
                      for s in memory.get_finished_spans()]))
''')

SCRIPT = textwrap.dedent('''
    import asyncio, json
    import grpc, httpx
    from fastapi import FastAPI
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_health.v1._async import HealthServicer
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edge.telemetry import install_metrics
    from services.common.metrics import MetricsInterceptor
    from tritongate.logs import REQUEST_ID, request_metadata
    from tritongate.tracing import instrument_app, setup_tracing

    memory = InMemorySpanExporter()
    provider = setup_tracing("embed", exporter=memory)  # a service: its server is traced
    GrpcAioInstrumentorClient().instrument(tracer_provider=provider)  # and the edge's side, here too

    async def grpc_call():
        server = grpc.aio.server(interceptors=[MetricsInterceptor()])
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        REQUEST_ID.set("rid-grpc")
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(),
                                                            metadata=request_metadata())
        await server.stop(None)

    async def http_call():
        app = FastAPI()
        app.add_api_route("/ping", lambda: {"ok": True})
        install_metrics(app)
        instrument_app(app, provider)
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://edge") as client:
            await client.get("/ping", headers={"X-Request-ID": "rid-http"})

    asyncio.run(grpc_call())
    asyncio.run(http_call())
''') + SPANS


def test_spans_cross_the_grpc_hop_and_carry_the_request_id() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout.splitlines()[-1])
    client = next(s for s in spans if s["kind"] == "CLIENT")
    server = next(s for s in spans if s["kind"] == "SERVER" and "Health" in s["name"])
    assert client["name"] == server["name"] == "/grpc.health.v1.Health/Check"
    assert (server["trace"], server["parent"]) == (client["trace"], client["id"])  # one trace, across the hop
    assert client["request_id"] == server["request_id"] == "rid-grpc"
    http = next(s for s in spans if s["kind"] == "SERVER" and "ping" in s["name"])
    assert http["request_id"] == "rid-http"


def test_missing_packages_are_one_clear_error() -> None:
    script = ("import sys; sys.modules['opentelemetry.sdk'] = None\n"
              "from tritongate.tracing import setup_tracing\nsetup_tracing('edge')")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "pip install 'tritongate[otel]'" in done.stderr.splitlines()[-1]


MANY = textwrap.dedent('''
    import asyncio, json
    import grpc
    from opentelemetry import trace
    from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from edge.channels import open_channel
    from edge.clients import LlmClient, ModelDirectory
    from services.common.metrics import MetricsInterceptor
    from services.llm.servicer import LlmServicer
    from tritongate.common.v1 import common_pb2
    from tritongate.llm.v1 import llm_pb2
    from tritongate.logs import bind_request_id
    from tritongate.registry import LLM
    from tritongate.tracing import setup_tracing

    memory = InMemorySpanExporter()
    provider = setup_tracing("llm", exporter=memory)  # a service: its server is traced
    GrpcAioInstrumentorClient().instrument(tracer_provider=provider)  # and the edge's side, here too

    class Model:
        async def generate(self, request, timeout):
            yield llm_pb2.GenerateResponse(accepted=llm_pb2.Accepted(prompt_tokens=1, choices=1))
            yield llm_pb2.GenerateResponse(usage=common_pb2.Usage(prompt_tokens=1))

    class Models:
        def get(self, name):
            return Model()

        def list_models(self):
            return common_pb2.ListModelsResponse(models=[common_pb2.ModelCard(id="m", kind=LLM.kind)])

    async def main():
        server = grpc.aio.server(interceptors=[MetricsInterceptor()])
        LLM.add_servicer(LlmServicer(Models()), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        llm = LlmClient(open_channel(f"127.0.0.1:{port}", LLM), ModelDirectory(timeout=5), 30, streams=1)
        edge = trace.get_tracer("edge")
        for request_id in ("rid-one", "rid-two"):  # two requests, one GenerateMany stream
            with edge.start_as_current_span(f"POST {request_id}", kind=trace.SpanKind.SERVER):
                bind_request_id(request_id)
                generation = await llm.generate(llm_pb2.GenerateRequest(model="m"))
                await generation.accepted()
                assert [delta async for delta in generation.deltas()] == []
        await llm.close()
        await server.stop(None)

    asyncio.run(main())
''') + SPANS


def test_a_generation_on_a_shared_stream_has_its_own_span_under_the_edges() -> None:
    done = subprocess.run([sys.executable, "-c", MANY], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    spans = json.loads(done.stdout.splitlines()[-1])
    calls = [s for s in spans if s["kind"] == "CLIENT" and "/Generate" in s["name"]]
    assert [s["name"] for s in calls] == ["/tritongate.llm.v1.LlmService/GenerateMany"]  # one stream, no Generate
    assert calls[0]["parent"] is None  # the stream is no one request's
    for request_id in ("rid-one", "rid-two"):
        edge = next(s for s in spans if s["name"] == f"POST {request_id}")
        generation = next(s for s in spans if s["name"] == "/tritongate.llm.v1.LlmService/Generate"
                          and s["request_id"] == request_id)
        assert generation["kind"] == "SERVER"
        assert (generation["trace"], generation["parent"]) == (edge["trace"], edge["id"])
