"""Optional OpenTelemetry tracing (TRITONGATE_OTEL, off by default; `pip install 'tritongate[otel]'`).

Spans go to an OTLP exporter configured by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_PROTOCOL: grpc by default or http/protobuf, OTEL_SERVICE_NAME, ...). The edge traces
its HTTP requests and its gRPC calls; a service traces the RPCs it serves, as children of the edge's
spans (the trace context travels in gRPC metadata). A request inside a shared RPC (an item of a batch
RPC, a generation of GenerateMany) carries its caller's span in its `ItemContext` instead (`traceparent`),
and the service gives it a span of its own under that one (`ItemSpans`), as it would give its own call.
Every span carries the request id.
"""

from __future__ import annotations

import os
from typing import Any

import grpc

from tritongate.logs import REQUEST_ID, on_bind

EXTRA = "pip install 'tritongate[otel]'"
ATTRIBUTE = "tritongate.request_id"
TRACEPARENT = "traceparent"  # the W3C header, as the gRPC metadata of a traced call carries it


class ItemSpans:
    """Trace context for the requests that share an RPC: the edge puts the current span in each request's
    `ItemContext`, the service starts the request's span under it."""

    def __init__(self, tracer: Any) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = tracer
        self.propagator = TraceContextTextMapPropagator()  # W3C, whatever OTEL_PROPAGATORS says
        self.server, self.error, self.status = SpanKind.SERVER, StatusCode.ERROR, Status

    def traceparent(self) -> str:
        """The current span as a W3C `traceparent`, for a request that goes inside a shared RPC."""
        carrier: dict[str, str] = {}
        self.propagator.inject(carrier)
        return carrier.get(TRACEPARENT, "")

    def start(self, name: str, traceparent: str, request_id: str) -> Any:
        """The span of a request inside a shared RPC, named as the call it stands for (`/<service>/<method>`),
        a child of the caller's span it carries (`traceparent`), started now; `end` ends it."""
        parent = self.propagator.extract({TRACEPARENT: traceparent})
        span = self.tracer.start_span(name, context=parent, kind=self.server)
        span.set_attribute(ATTRIBUTE, request_id)  # the request's own, whatever the task has bound
        return span

    def end(self, span: Any, code: grpc.StatusCode) -> None:
        """End the span with the status its request ended with."""
        span.set_attribute("rpc.grpc.status_code", code.value[0])  # as the gRPC instrumentation sets it
        if code is not grpc.StatusCode.OK:
            span.set_status(self.status(self.error, code.name))
        span.end()


# Process-wide, as the tracer provider it uses: set by setup_tracing, None while tracing is off (then its users
# make no call at all: `tracing.ITEM_SPANS and tracing.ITEM_SPANS.traceparent()`).
ITEM_SPANS: ItemSpans | None = None


class TracingUnavailable(RuntimeError):
    """TRITONGATE_OTEL is on but the OpenTelemetry packages are missing."""


def _exporter() -> Any:
    protocol = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
    if protocol and protocol.startswith("http"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter()
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def setup_tracing(component: str, exporter: Any = None) -> Any:
    """Install a tracer provider for this process and instrument gRPC: the client side in the edge, the
    server side in a service. Returns the provider. `exporter` replaces OTLP (tests)."""
    try:
        from opentelemetry import trace
        from opentelemetry.instrumentation.grpc import GrpcAioInstrumentorClient, GrpcAioInstrumentorServer
        from opentelemetry.sdk.resources import SERVICE_NAME, Resource
        from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        raise TracingUnavailable(f"TRITONGATE_OTEL is on, but OpenTelemetry is not installed ({exc.name}): "
                                 f"{EXTRA}") from None

    class RequestIdSpans(SpanProcessor):
        """Spans started while a request is served (the edge's gRPC calls) carry its id."""

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            span.set_attribute(ATTRIBUTE, REQUEST_ID.get())

    # OTEL_SERVICE_NAME, when set, wins over the component's name.
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: f"tritongate-{component}"}
    provider = TracerProvider(resource=Resource.create(attributes))
    provider.add_span_processor(RequestIdSpans())
    provider.add_span_processor(BatchSpanProcessor(exporter if exporter is not None else _exporter()))
    trace.set_tracer_provider(provider)
    global ITEM_SPANS
    ITEM_SPANS = ItemSpans(provider.get_tracer(__name__))
    # The span of the HTTP request or RPC starts before its id is known: it gets the id when bound.
    on_bind(lambda request_id: trace.get_current_span().set_attribute(ATTRIBUTE, request_id))
    # Both patch grpc.aio's constructors: channels and servers made from now on are traced.
    if component == "edge":
        GrpcAioInstrumentorClient().instrument(tracer_provider=provider)
    else:
        GrpcAioInstrumentorServer().instrument(tracer_provider=provider)
    return provider


def instrument_app(app: Any, provider: Any = None) -> None:
    """Trace the edge's HTTP requests (after setup_tracing)."""
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor

    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider, excluded_urls="health,metrics")
