"""The edge's side of every gRPC call: one typed client per service, and the model directory.

Every call goes through a `ServiceClient`: it checks that the model is one of its service's (the
`ModelDirectory`: the services' ListModels, merged), sends the request id in the metadata, maps a failure
to an OpenAI error (edge/errors.py), and records the model and the usage on the request's Exchange for the
metrics and the access log. The channels the clients call on (edge/channels.py) are opened and closed by
the app's lifespan (`ServiceClients`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar

import grpc

from edge.channels import open_channel
from edge.coalesce import BatchCalls, Coalescer
from edge.errors import OpenAIError, bad_request, from_grpc, from_item, model_not_found
from edge.keys.caller import caller
from edge.many import GenerateStreams, ManyGeneration
from edge.telemetry import TokenTimer, current
from tritongate import tracing
from tritongate.batching import EDGE_SLOTS
from tritongate.common.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tritongate.embed.v1 import embed_pb2
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import REQUEST_ID, request_metadata
from tritongate.registry import BY_KIND, EMBED, LLM, RERANK, ServiceInfo
from tritongate.rerank.v1 import rerank_pb2
from tritongate.settings import Settings
from tritongate.tls import client_tls

if TYPE_CHECKING:
    from tritongate.embed.v1.embed_pb2_grpc import EmbedServiceAsyncStub
    from tritongate.llm.v1.llm_pb2_grpc import LlmServiceAsyncStub
    from tritongate.rerank.v1.rerank_pb2_grpc import RerankServiceAsyncStub

log = logging.getLogger(__name__)

R = TypeVar("R")
E = TypeVar("E", bound="EncoderClient")
EOF_: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # (missing from grpc-stubs)


class ServiceClient:
    """One service as the edge sees it: the calls every service has, and the one way to make a call."""

    service: ClassVar[ServiceInfo]
    stub: Any  # the service's generated stub; each subclass declares its type

    def __init__(self, channel: grpc.aio.Channel, directory: ModelDirectory, timeout: float,
                 retry_after_s: int = 1) -> None:
        self.channel = channel
        self.stub = self.service.stub(channel)
        self.tokenizer = tokenizer_pb2_grpc.TokenizerServiceStub(channel)  # every service has one
        self.directory = directory
        self.timeout = timeout  # each call's deadline
        self.retry_after_s = retry_after_s  # what a 429 from this service tells the client
        directory.clients.append(self)

    def failure(self, error: grpc.aio.AioRpcError) -> OpenAIError:
        return from_grpc(error, self.service.name, self.retry_after_s)

    async def list_models(self, timeout: float) -> list[common_pb2.ModelCard]:
        response = await self.stub.ListModels(common_pb2.ListModelsRequest(), timeout=timeout,
                                              metadata=request_metadata())
        return list(response.models)

    async def _route_and_label(self, model: str) -> None:
        """404 unless one of this service's models (400 another's, 503 service down); from here on the
        model labels the request's metrics and access-log line."""
        await self.directory.route(model, self.service)
        current().model = model

    async def _route_and_wait(self, model: str) -> None:
        """As `_route_and_label`, then, for inference, wait for the model's turn (edge/queue.py)."""
        await self._route_and_label(model)
        who = caller()
        if who is not None:
            await who.enter(model)

    async def _call(self, method: Callable[..., Awaitable[R]], request: Any) -> R:
        """Route `request.model`, make the call, map its failure."""
        await self._route_and_label(request.model)
        try:
            return await method(request, timeout=self.timeout, metadata=request_metadata())
        except grpc.aio.AioRpcError as exc:
            raise self.failure(exc) from None

    def item_failure(self, error: common_pb2.ItemError) -> OpenAIError:
        return from_item(error, self.service.name, self.retry_after_s)

    async def close(self) -> None:
        await self.channel.close(None)

    async def tokenize(self, request: tokenizer_pb2.TokenizeRequest) -> tokenizer_pb2.TokenizeResponse:
        return await self._call(self.tokenizer.Tokenize, request)

    async def detokenize(self, request: tokenizer_pb2.DetokenizeRequest) -> tokenizer_pb2.DetokenizeResponse:
        return await self._call(self.tokenizer.Detokenize, request)


class EncoderClient(ServiceClient):
    """A service of unary calls that the edge coalesces (edge/coalesce.py): embed and rerank."""

    def __init__(self, channel: grpc.aio.Channel, directory: ModelDirectory, timeout: float,
                 retry_after_s: int = 1, calls_per_model: int = EDGE_SLOTS) -> None:
        super().__init__(channel, directory, timeout, retry_after_s)
        self.coalescer = Coalescer(self.batch_calls(), timeout, calls_per_model)

    def batch_calls(self) -> BatchCalls:
        raise NotImplementedError

    async def _unary(self, request: Any) -> Any:
        """Route `request.model`, make the call (with others for the same model, when busy), map its
        failure, record its usage."""
        await self._route_and_wait(request.model)
        response = await self.coalescer.call(request)
        exchange = current()
        exchange.record_usage(response.usage)
        exchange.record_timings(response.timings)
        return response


def _embed_inputs(request: embed_pb2.EmbedRequest) -> int:
    return len(request.texts.texts) if request.WhichOneof("input") == "texts" else len(request.tokens.inputs)


class EmbedClient(EncoderClient):
    service = EMBED
    stub: EmbedServiceAsyncStub

    def batch_calls(self) -> BatchCalls:
        return BatchCalls(self.stub.Embed, self.stub.EmbedBatch, embed_pb2.EmbedBatchRequest,
                          embed_pb2.EmbedBatchItem, _embed_inputs, self.failure, self.item_failure)

    async def embed(self, request: embed_pb2.EmbedRequest) -> embed_pb2.EmbedResponse:
        response: embed_pb2.EmbedResponse = await self._unary(request)
        return response


class RerankClient(EncoderClient):
    service = RERANK
    stub: RerankServiceAsyncStub

    def batch_calls(self) -> BatchCalls:
        return BatchCalls(self.stub.Rerank, self.stub.RerankBatch, rerank_pb2.RerankBatchRequest,
                          rerank_pb2.RerankBatchItem, lambda request: len(request.documents), self.failure,
                          self.item_failure)

    async def rerank(self, request: rerank_pb2.RerankRequest) -> rerank_pb2.RerankResponse:
        response: rerank_pb2.RerankResponse = await self._unary(request)
        return response


class LlmClient(ServiceClient):
    service = LLM
    stub: LlmServiceAsyncStub

    def __init__(self, channel: grpc.aio.Channel, directory: ModelDirectory, timeout: float,
                 retry_after_s: int = 1, streams: int = 0) -> None:
        super().__init__(channel, directory, timeout, retry_after_s)
        # `streams` GenerateMany streams carry the generations (edge/many.py); 0: a Generate call each.
        self.streams = GenerateStreams(self.stub, streams, self.item_failure) if streams else None

    async def generate(self, request: llm_pb2.GenerateRequest, names: Mapping[str, str] | None = None) -> Generation:
        """Start a generation (nothing is read yet). `names`: the client's name of each GenerateRequest
        field it calls otherwise, for the parameter a refusal names."""
        await self._route_and_wait(request.model)
        who = caller()
        if who is not None:  # Triton's priority level, where the model's scheduler has levels
            request.priority = who.effective_priority()
        messages: Messages
        if self.streams is not None:
            spans = tracing.ITEM_SPANS  # None while tracing is off
            context = common_pb2.ItemContext(request_id=REQUEST_ID.get(), timeout_s=self.timeout,
                                             traceparent=spans.traceparent() if spans is not None else "")
            messages = ManyGeneration(self.streams, request, context)
        else:
            messages = _Call(self.stub.Generate(request, timeout=self.timeout, metadata=request_metadata()), self)
        return Generation(messages, self, names or {})

    async def close(self) -> None:
        if self.streams is not None:
            await self.streams.close()
        await super().close()


class Messages(Protocol):
    """Where a generation's messages come from: `next()` gives each, None after the last, and raises an
    OpenAIError on failure; `cancel()` stops the generation."""

    async def next(self) -> llm_pb2.GenerateResponse | None: ...

    def cancel(self) -> None: ...


class _Call:
    """A Generate call of its own."""

    __slots__ = ("call", "client")

    def __init__(self, call: Any, client: LlmClient) -> None:
        self.call = call  # grpc.aio.UnaryStreamCall[GenerateRequest, GenerateResponse]
        self.client = client

    async def next(self) -> llm_pb2.GenerateResponse | None:
        try:
            message = await self.call.read()
        except grpc.aio.AioRpcError as exc:
            raise self.client.failure(exc) from None
        return None if message is EOF_ else message

    def cancel(self) -> None:
        self.call.cancel()


class Generation:
    """One generation: `accepted()` first (until then, a failure is an ordinary HTTP error with the
    right status), then `deltas()`. The usage that closes it goes on the Exchange."""

    def __init__(self, messages: Messages, client: LlmClient, names: Mapping[str, str]) -> None:
        self.messages = messages
        self.client = client
        self.names = names
        self.usage = common_pb2.Usage()

    async def _next(self) -> llm_pb2.GenerateResponse | None:
        """The next message; None at the end; an OpenAIError (naming the client's own parameter) on failure."""
        try:
            return await self.messages.next()
        except OpenAIError as error:
            error.param = self.names.get(error.param or "", error.param)
            raise

    async def accepted(self) -> llm_pb2.Accepted:
        first = await self._next()
        if first is None or first.WhichOneof("event") != "accepted":
            raise OpenAIError(500, f"The {self.client.service.name} service answered out of order; see its log.")
        current().record_timings(first.timings)
        return first.accepted

    async def deltas(self) -> AsyncIterator[llm_pb2.Delta]:
        """The deltas; then `usage` holds what the service reported."""
        exchange = current()
        timer = TokenTimer(exchange.model)
        while (message := await self._next()) is not None:
            if message.WhichOneof("event") == "usage":
                self.usage.CopyFrom(message.usage)
                exchange.record_usage(message.usage, completion=True)
                exchange.record_timings(message.timings)
            else:
                timer.tick()
                yield message.delta

    def cancel(self) -> None:
        self.messages.cancel()


class ModelDirectory:
    """Which service serves which model id: the services' ListModels, merged, cached briefly."""

    def __init__(self, timeout: float, ttl: float = 5.0, retry_after_s: int = 1) -> None:
        self.clients: list[ServiceClient] = []  # each client adds itself
        self.timeout = timeout
        self.ttl = ttl
        self.retry_after_s = retry_after_s  # what a 503 for a service that is down tells the client
        self._cards: dict[str, common_pb2.ModelCard] = {}
        self._fetched = 0.0
        self._lock = asyncio.Lock()
        self._down: set[str] = set()  # services that did not answer the last refresh

    async def refresh(self) -> dict[str, common_pb2.ModelCard]:
        """Ask every service concurrently; a service that is down or slow drops out."""
        clients = list(self.clients)
        results = await asyncio.gather(*(c.list_models(self.timeout) for c in clients), return_exceptions=True)
        cards: dict[str, common_pb2.ModelCard] = {}
        self._down = set()
        for client, result in zip(clients, results, strict=True):
            if isinstance(result, BaseException):
                self._down.add(client.service.name)
                log.debug("%s service did not list its models: %s", client.service.name, result)
                continue
            for card in result:
                cards.setdefault(card.id, card)
        self._cards, self._fetched = cards, time.monotonic()
        return cards

    async def models(self, max_age: float | None = None) -> dict[str, common_pb2.ModelCard]:
        max_age = self.ttl if max_age is None else max_age
        if time.monotonic() - self._fetched > max_age:
            async with self._lock:
                if time.monotonic() - self._fetched > max_age:
                    await self.refresh()
        return self._cards

    async def of_kind(self, service: ServiceInfo) -> list[str]:
        return [card.id for card in (await self.models()).values() if card.kind == service.kind]

    async def default(self, service: ServiceInfo, configured: str | None) -> str:
        """The model of a request that names none: `configured` (the edge's setting) when set, else the
        first model `service` lists."""
        if configured:
            return configured
        models = await self.of_kind(service)
        if not models:
            self._raise_if_down(service)
            raise OpenAIError(404, f"The {service.name} service serves no model.", "model", "model_not_found")
        return models[0]

    async def find(self, model: str) -> common_pb2.ModelCard:
        """The card of `model`; 404 when unknown or when the caller's key may not use it (the same answer)."""
        who = caller()
        if who is not None and not who.allows(model):
            raise model_not_found(model)
        found = (await self.models()).get(model) or (await self.models(max_age=0.5)).get(model)
        if found is None:
            raise model_not_found(model)
        return found

    def _raise_if_down(self, service: ServiceInfo) -> None:
        if service.name in self._down:
            raise OpenAIError(503, f"The {service.name} service is unavailable; try again shortly.",
                              code="service_unavailable", headers={"Retry-After": str(self.retry_after_s)}) from None

    async def route(self, model: Any, service: ServiceInfo) -> common_pb2.ModelCard:
        """The card of `model`, which `service` must serve: 404 when unknown, 400 when another service's,
        503 when unknown while `service` is down (the model may well be one of its own)."""
        if not isinstance(model, str) or not model:
            raise bad_request("`model` must be a non-empty string.", "model")
        try:
            card = await self.find(model)
        except OpenAIError:
            self._raise_if_down(service)
            raise
        if card.kind != service.kind:
            other = BY_KIND[card.kind].serves if card.kind in BY_KIND else "different"
            raise bad_request(f"The model `{model}` is a {other} model and cannot serve {service.serves} requests.",
                              "model", "model_not_supported")
        return card


@dataclass
class ServiceClients:
    """Every service's client and the directory they share; what the edge's lifespan opens and closes."""

    directory: ModelDirectory
    llm: LlmClient
    embed: EmbedClient
    rerank: RerankClient

    @classmethod
    def open(cls, settings: Settings) -> ServiceClients:
        tls = client_tls(settings)
        directory = ModelDirectory(timeout=settings.list_models_timeout_s, retry_after_s=settings.retry_after_s)

        def channel(kind: type[ServiceClient]) -> grpc.aio.Channel:
            return open_channel(settings.target(kind.service), kind.service, tls)

        def encoder(kind: type[E]) -> E:
            return kind(channel(kind), directory, settings.unary_timeout_s, settings.retry_after_s,
                        settings.calls_per_model)

        llm = LlmClient(channel(LlmClient), directory, settings.request_timeout_s, settings.retry_after_s,
                        settings.llm_streams)
        return cls(directory, llm, encoder(EmbedClient), encoder(RerankClient))

    @property
    def all(self) -> list[ServiceClient]:
        return self.directory.clients

    async def for_model(self, model: Any) -> ServiceClient:
        """The client of the service that serves `model` (404 when none does)."""
        if not isinstance(model, str) or not model:
            raise bad_request("`model` must be a non-empty string.", "model")
        card = await self.directory.find(model)
        return next(client for client in self.all if client.service.kind == card.kind)

    async def close(self) -> None:
        for client in self.all:
            await client.close()
