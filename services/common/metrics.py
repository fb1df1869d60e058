"""Per-RPC bookkeeping of the gRPC services, and their Prometheus metrics.

The interceptor is the one place a service reads an RPC's request id: it takes it from the RPC's metadata
(tritongate.wire.REQUEST_ID_KEY) and binds it (tritongate.logs.REQUEST_ID) for the handler's log lines and
Triton calls; everything else reads `REQUEST_ID.get()`. (Requests that share an RPC, the items of a batch
RPC and the generations of GenerateMany, carry theirs in their `ItemContext`, bound where each is served.)
It also counts RPCs started, handled (by status code), in flight, and their latency, under the names
go-grpc-prometheus made common; a request inside a shared RPC counts there as the call it stands for, and
in BATCHED under the shared RPC (services/common/items.py). Triton calls, each model's Triton endpoints
and encoder batches are measured too. Served over HTTP on TRITONGATE_METRICS_PORT (`--metrics-port`;
0 = off).

Where each request's time went (`Stages`: queue, tokenization, inference) travels back to the edge in the
answer (`common.v1.Timings`), which shows it to the client, logs it and exports it per stage: the edge
sees every stage of a request, its own included, so the services export no histogram of their own."""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import grpc
from prometheus_client import Counter, Gauge, Histogram, start_http_server

from tritongate.common.v1 import common_pb2
from tritongate.logs import NO_REQUEST, bind_request_id, sane_request_id
from tritongate.wire import REQUEST_ID_KEY

_LABELS = ("grpc_service", "grpc_method", "grpc_type")

STARTED = Counter("grpc_server_started_total", "RPCs started on the server.", _LABELS)
HANDLED = Counter("grpc_server_handled_total", "RPCs completed on the server, by status code.",
                  (*_LABELS, "grpc_code"))
IN_FLIGHT = Gauge("grpc_server_in_flight", "RPCs being handled now.", _LABELS)
LATENCY = Histogram("grpc_server_handling_seconds", "Time from an RPC's start to its end on the server.",
                    _LABELS, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300))
TRITON_LATENCY = Histogram("tritongate_triton_request_duration_seconds",
                           "Time of one Triton call (a whole stream for generation), by Triton model and outcome "
                           "(a gRPC status code name).", ("model", "outcome"),
                           buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 300))
# Per Triton endpoint of a model (services/common/triton_pool.py), by model id and endpoint address.
_ENDPOINT = ("model", "endpoint")
ENDPOINT_CALLS = Counter("tritongate_triton_endpoint_calls_total",
                         "Triton calls sent to each endpoint of a model (a retry counts again).", _ENDPOINT)
ENDPOINT_IN_FLIGHT = Gauge("tritongate_triton_endpoint_in_flight",
                           "Triton calls of a model in flight on each endpoint (a generation until its stream ends).",
                           _ENDPOINT)
ENDPOINT_READY = Gauge("tritongate_triton_endpoint_ready",
                       "1 while an endpoint takes the model's calls (the model ready there), else 0.", _ENDPOINT)
ENDPOINT_EJECTIONS = Counter("tritongate_triton_endpoint_ejections_total",
                             "Times an endpoint was taken out of a model's rotation (a call found it unavailable, "
                             "or its readiness check said no).", _ENDPOINT)
# Where generations went (services/common/prefix_routing.py).
ROUTING_DECISIONS = Counter("tritongate_routing_decisions_total",
                            "Generations sent to a Triton endpoint, by model and why that endpoint: its affinity "
                            "key (affinity), the longest recorded prefix (prefix), or the least load (load).",
                            ("model", "reason"))
ROUTING_HIT_TOKENS = Counter("tritongate_routing_prefix_hit_tokens_total",
                             "Prompt tokens the routing record estimated an endpoint held cached when it was picked.",
                             _ENDPOINT)
ROUTING_IMBALANCE = Gauge("tritongate_routing_imbalance",
                          "Calls in flight on a model's busiest ready endpoint minus its least busy one's, at the "
                          "last routed pick.", ("model",))
ROUTING_PROMPT_TOKENS = Counter("tritongate_routing_prompt_tokens_total",
                                "Prompt tokens of the generations sent to each endpoint.", _ENDPOINT)
ROUTING_CACHED_TOKENS = Counter("tritongate_routing_cached_tokens_total",
                                "Prompt tokens an endpoint's backend reported it took from its cache (usage "
                                "`cached_tokens`).", _ENDPOINT)
BATCHED = Counter("tritongate_batched_requests_total",
                  "Requests that shared an RPC with others (the items of EmbedBatch and RerankBatch, the "
                  "generations of GenerateMany), by that RPC's method and the request's outcome (a gRPC status "
                  "code name); each also counts as the call it stands for (Embed, Rerank, Generate) in the "
                  "grpc_server_* metrics, and the shared RPC once as itself.", ("grpc_method", "outcome"))
BATCH_SIZE = Histogram("tritongate_batch_size", "Rows per Triton call of an encoder model (requests merged).",
                       ("model",), buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512))


# How an interceptor wraps a method handler (this one and admission's, services/common/admission.py): each
# says what runs around an RPC (an async context manager given the RPC's context), and `around` rebuilds the
# handler with it.
Scope = Callable[[grpc.aio.ServicerContext], AbstractAsyncContextManager[None]]

# (request streaming, response streaming) → the handler's type label, its behaviour attribute, its factory.
_KINDS = {
    (False, False): ("unary", "unary_unary", grpc.unary_unary_rpc_method_handler),
    (False, True): ("server_stream", "unary_stream", grpc.unary_stream_rpc_method_handler),
    (True, False): ("client_stream", "stream_unary", grpc.stream_unary_rpc_method_handler),
    (True, True): ("bidi_stream", "stream_stream", grpc.stream_stream_rpc_method_handler),
}


def method_of(details: grpc.HandlerCallDetails) -> tuple[str, str]:
    """("tritongate.embed.v1.EmbedService", "Embed") from "/tritongate.embed.v1.EmbedService/Embed"."""
    service, _, method = details.method.lstrip("/").rpartition("/")
    return service, method


def kind_of(handler: grpc.RpcMethodHandler) -> str:
    return _KINDS[(handler.request_streaming, handler.response_streaming)][0]


def around(handler: grpc.RpcMethodHandler, scope: Scope) -> grpc.RpcMethodHandler:
    """The same handler, its behaviour run inside `scope(context)`."""
    _, attribute, factory = _KINDS[(handler.request_streaming, handler.response_streaming)]
    behavior = getattr(handler, attribute)
    wrapped: Callable[..., Any]
    if inspect.isasyncgenfunction(behavior):

        async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with scope(context):
                async for response in behavior(request, context):
                    yield response

        wrapped = stream
    else:

        async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
            async with scope(context):
                return await behavior(request, context)

        wrapped = unary
    return factory(wrapped, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def _code(context: grpc.aio.ServicerContext, error: BaseException | None) -> grpc.StatusCode:
    if isinstance(error, asyncio.CancelledError):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN if error is not None else grpc.StatusCode.OK


def count_started(labels: tuple[str, str, str]) -> float:
    """Counts a call of `labels` (service, method, type) started and in flight; returns its start time."""
    STARTED.labels(*labels).inc()
    IN_FLIGHT.labels(*labels).inc()
    return time.perf_counter()


def count_handled(labels: tuple[str, str, str], start: float, code: grpc.StatusCode) -> None:
    """Counts the call `count_started` started as handled, with its code and latency."""
    IN_FLIGHT.labels(*labels).dec()
    HANDLED.labels(*labels, code.name).inc()
    LATENCY.labels(*labels).observe(time.perf_counter() - start)


class _Rpc:
    """Around one RPC: binds the caller's request id (each RPC runs in its own task, so it is that RPC's
    alone); counts it started and in flight on entry, handled with its code and latency on exit."""

    __slots__ = ("context", "labels", "request_id", "start")

    def __init__(self, labels: tuple[str, str, str], request_id: str, context: grpc.aio.ServicerContext) -> None:
        self.labels, self.request_id, self.context = labels, request_id, context

    async def __aenter__(self) -> None:
        bind_request_id(self.request_id)
        self.start = count_started(self.labels)

    async def __aexit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        count_handled(self.labels, self.start, _code(self.context, error))


def _request_id(metadata: Sequence[tuple[str, Any]] | None) -> str:
    """The caller's request id from the metadata, when it is safe to log and send on."""
    value = next((v for k, v in metadata or () if k == REQUEST_ID_KEY), None)
    return sane_request_id(value if isinstance(value, str) else None) or NO_REQUEST


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    """Wraps every method handler of the server it is installed on (install it first: outermost), so
    that the request id is bound before anything else of the RPC runs."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED itself
            return handler
        labels = (*method_of(handler_call_details), kind_of(handler))
        request_id = _request_id(handler_call_details.invocation_metadata)
        return around(handler, functools.partial(_Rpc, labels, request_id))


@contextmanager
def triton_call(model: str) -> Iterator[None]:
    """Measures one Triton call; the outcome is the gRPC code of what it raised (OK when nothing)."""
    start = time.perf_counter()
    outcome = "OK"
    try:
        yield
    except GeneratorExit:  # the caller closed a stream early (e.g. at a stop string): not a failure
        raise
    except asyncio.CancelledError:
        outcome = "CANCELLED"
        raise
    except BaseException as exc:
        code = getattr(exc, "code", None)
        outcome = code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"
        raise
    finally:
        TRITON_LATENCY.labels(model, outcome).observe(time.perf_counter() - start)


@dataclass(slots=True)
class Stages:
    """Where one request's time went in this service, in seconds (None: a stage its path does not have)."""

    queue: float | None = None  # in the encoder batcher, until the last Triton call with its rows started
    tokenization: float | None = None
    inference: float | None = None  # the model: that Triton call, or a generation's streams

    @contextmanager
    def tokenizing(self) -> Iterator[None]:
        """Adds the block's time to `tokenization` (a request may be tokenized in several steps)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.tokenization = (self.tokenization or 0.0) + time.perf_counter() - start

    def proto(self) -> common_pb2.Timings:
        return common_pb2.Timings(queue_s=self.queue, tokenization_s=self.tokenization, inference_s=self.inference)


def handled_by_code() -> dict[str, int]:
    """RPCs completed so far in this process, summed over methods, by status code."""
    totals: dict[str, int] = {}
    for metric in HANDLED.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                code = sample.labels["grpc_code"]
                totals[code] = totals.get(code, 0) + int(sample.value)
    return totals


def in_flight() -> int:
    return sum(int(sample.value) for metric in IN_FLIGHT.collect() for sample in metric.samples)


def serve_metrics(host: str, port: int) -> None:
    """Serve /metrics over HTTP from a background thread (Prometheus' own server)."""
    start_http_server(port, addr=host)
