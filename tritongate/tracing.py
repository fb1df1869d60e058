"""Optional OpenTelemetry tracing (TRITONGATE_OTEL, off by default; `pip install 'tritongate[otel]'`).

Spans go to an OTLP exporter configured by the standard OTEL_* variables (OTEL_EXPORTER_OTLP_ENDPOINT,
OTEL_EXPORTER_OTLP_PROTOCOL: grpc by default or http/protobuf, OTEL_SERVICE_NAME, ...). The edge traces
its HTTP requests and its gRPC calls; a service traces the RPCs it serves, as children of the edge's
spans (the trace context travels in gRPC metadata). Every span carries the request id.
"""

from __future__ import annotations

import os
from typing import Any

from tritongate.logs import REQUEST_ID, on_bind

EXTRA = "pip install 'tritongate[otel]'"
ATTRIBUTE = "tritongate.request_id"


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
