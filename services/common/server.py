"""The gRPC server every service runs: health, reflection, readiness that follows Triton, connection
ageing so clients find new replicas, and graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection

from services.common.admission import Admission, AdmissionInterceptor
from services.common.errors import ServiceError, invalid_argument, model_not_found, rpc
from services.common.metrics import MetricsInterceptor, handled_by_code, in_flight
from services.common.tokenize import TokenizerServicer
from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from tritongate.common.v1 import common_pb2, tokenizer_pb2, tokenizer_pb2_grpc
from tritongate.config import TritonModelEntry
from tritongate.llm.v1 import llm_pb2
from tritongate.registry import ModelKind, ServiceInfo
from tritongate.wire import MAX_MESSAGE_BYTES

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# Health service name that is SERVING while the process runs, whatever Triton does (liveness probes);
# "" and the service's own name follow Triton's readiness (readiness probes, load balancers).
LIVENESS = "liveness"


class ServedModel:
    """A configured model backed by a Triton model on one or more Triton endpoints; subclasses add
    tokenization and inference."""

    kind: ModelKind = common_pb2.MODEL_KIND_UNSPECIFIED  # subclasses: their service's (tritongate/registry.py)
    tokenizer: PreTrainedTokenizerBase  # subclasses load it

    def __init__(self, entry: TritonModelEntry, triton: Triton) -> None:
        self.entry = entry
        self.name = entry.name
        self.triton = triton
        self.triton_pool = TritonPool(entry.triton_addresses, entry.name, triton.resolve_every_s)
        self.triton_name = entry.triton_name
        self.created = int(time.time())
        self.why_not_ready: str | None = "not checked yet"  # None: ready

    @property
    def ready(self) -> bool:
        return self.why_not_ready is None

    def card(self) -> common_pb2.ModelCard:
        return common_pb2.ModelCard(id=self.name, kind=self.kind, created=self.created,
                                    triton_model=self.triton_name)

    def cards(self) -> list[common_pb2.ModelCard]:
        """Every model id this model answers to: its own card, then those of its variants (LoRA adapters,
        whose `parent` is this model)."""
        return [self.card()]

    async def refresh(self) -> bool:
        """Follow the Triton model's readiness on each endpoint: ready while one endpoint has it ready. Read
        its configuration (from a ready endpoint) each time it becomes ready."""
        why_not = await self.triton_pool.refresh(lambda address: self.triton.why_not_ready(address, self.triton_name))
        ready = why_not is None
        if ready and not self.ready:
            address = self.triton_pool.ready()[0].address
            self.on_ready(await self.triton.model_config(address, self.triton_name))
            log.info("model %s ready (Triton model %s at %s)", self.name, self.triton_name,
                     ",".join(endpoint.address for endpoint in self.triton_pool.ready()))
        elif self.ready and not ready:
            log.warning("model %s is no longer ready in Triton at %s: %s", self.name, self.triton_pool, why_not)
        self.why_not_ready = why_not
        return ready

    async def ensure_ready(self) -> None:
        """Before serving a request: UNAVAILABLE unless the Triton model is (or has just become) ready."""
        if not self.ready and not await self.refresh():
            raise ServiceError(grpc.StatusCode.UNAVAILABLE, f"model `{self.name}` is not ready in Triton at "
                               f"{self.triton_pool}: {self.why_not_ready}")

    def on_ready(self, triton_config: dict[str, Any]) -> None:
        """Read what the service needs from the Triton model configuration."""

    def chat_tokens(self, chat: tokenizer_pb2.TokenizerChat) -> list[int]:
        """A chat as the model's prompt, in token ids (the TokenizerService); only LLMs have chat templates."""
        raise invalid_argument(f"Model `{self.name}` has no chat template: send `prompt`.", "messages")

    def generation_tokens(self, request: llm_pb2.GenerateRequest) -> list[int]:
        """A generation input's prompt tokens (the TokenizerService); only LLMs generate."""
        raise invalid_argument(f"Model `{self.name}` does not generate text.", "model")


M = TypeVar("M", bound=ServedModel)


class ModelSet(Generic[M]):
    """The models one service serves, by public id (a LoRA adapter's id finds the model it runs on)."""

    def __init__(self, models: Iterable[M]) -> None:
        self._models = {model.name: model for model in models}
        self._ids = {card.id: model for model in self._models.values() for card in model.cards()}

    def get(self, name: str) -> M:
        try:
            return self._ids[name]
        except KeyError:
            raise model_not_found(name) from None

    def __iter__(self) -> Iterator[M]:
        return iter(self._models.values())

    def names(self) -> list[str]:
        return list(self._models)

    def list_models(self) -> common_pb2.ListModelsResponse:
        return common_pb2.ListModelsResponse(models=[card for model in self for card in model.cards()])

    async def refresh(self) -> bool:
        results = await asyncio.gather(*(model.refresh() for model in self), return_exceptions=True)
        for model, result in zip(self, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("model %s: readiness check failed: %s", model.name, result)
        return bool(results) and all(result is True for result in results)


@dataclass(frozen=True)
class ServerOptions:
    """How a service's gRPC server treats its connections and calls (run_service takes them from the
    settings)."""

    credentials: grpc.ServerCredentials | None = None  # TLS when given
    max_connection_age_ms: int = 30_000
    grace_s: float = 30.0
    max_in_flight: int = 256  # inference RPCs worked on at once; more are refused (RESOURCE_EXHAUSTED)

    def grpc_options(self) -> list[tuple[str, Any]]:
        """Connections are closed after an age so that clients re-resolve DNS and spread over replicas
        added later; the grace lets streams in flight finish first."""
        return [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_connection_age_ms", self.max_connection_age_ms),
            ("grpc.max_connection_age_grace_ms", int(self.grace_s * 1000)),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
            ("grpc.keepalive_permit_without_calls", 1),
        ]


class ListModelsServicer(Generic[M]):
    """The ListModels RPC every servicer has."""

    def __init__(self, models: ModelSet[M]) -> None:
        self.models = models
        self.admission: Admission | None = None  # the server's, for the per-item slots of the RPCs that carry several
        self.stopping = asyncio.Event()  # set while the server drains: requests on streams already open are refused

    @rpc
    async def ListModels(self, request: common_pb2.ListModelsRequest, context: grpc.aio.ServicerContext
                         ) -> common_pb2.ListModelsResponse:
        return self.models.list_models()


@dataclass
class ServiceSpec:
    """What a service contributes to the shared server: its registry entry (gRPC name and generated
    registration) and its servicer, which holds the models."""

    service: ServiceInfo
    servicer: ListModelsServicer[Any]

    @property
    def grpc_service(self) -> str:
        return self.service.grpc_service

    @property
    def models(self) -> ModelSet[Any]:
        return self.servicer.models

    def add_to(self, server: grpc.aio.Server) -> None:
        self.service.add_servicer(self.servicer, server)


@dataclass
class RunningService:
    server: grpc.aio.Server
    port: int
    health: HealthServicer
    watcher: asyncio.Task[None]
    triton: Triton
    servicer: ListModelsServicer[Any]

    async def stop(self, grace: float | None) -> None:
        """Report NOT_SERVING, refuse new RPCs (and new requests on streams already open), let those in
        flight finish within `grace`."""
        await self.health.enter_graceful_shutdown()
        self.servicer.stopping.set()
        self.watcher.cancel()
        await self.server.stop(grace)
        with contextlib.suppress(asyncio.CancelledError):
            await self.watcher
        await self.triton.close()


async def _watch_readiness(models: ModelSet[Any], health_servicer: HealthServicer,
                           names: Sequence[str], triton: Triton) -> None:
    serving: bool | None = None
    while True:
        ready = await models.refresh()
        if ready != serving:
            status = health_pb2.HealthCheckResponse.SERVING if ready else health_pb2.HealthCheckResponse.NOT_SERVING
            for name in names:
                await health_servicer.set(name, status)
            log.info("health: %s", "SERVING" if ready else "NOT_SERVING (waiting for Triton models)")
            serving = ready
        await triton.close_idle()
        # A Triton call that finds Triton unreachable wakes the watcher early: NOT_SERVING within a moment.
        await triton.wait_unreachable(5.0 if ready else 1.0)


async def start_service(spec: ServiceSpec, triton: Triton, *, host: str, port: int,
                        options: ServerOptions | None = None) -> RunningService:
    """Start serving on host:port (0 picks a free port), over TLS when the options have credentials; health
    is NOT_SERVING until Triton is ready."""
    options = options or ServerOptions()
    credentials = options.credentials
    # Metrics first (outermost), so that refusals for overload are counted too.
    name = spec.grpc_service
    admission = AdmissionInterceptor(options.max_in_flight, (name,))
    spec.servicer.admission = admission.admission
    interceptors = [MetricsInterceptor(), admission]
    server = grpc.aio.server(interceptors=interceptors, options=options.grpc_options())
    spec.add_to(server)
    tokenizer_pb2_grpc.add_TokenizerServiceServicer_to_server(TokenizerServicer(spec.models), server)
    health_servicer = HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        (name, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME,
         tokenizer_pb2.DESCRIPTOR.services_by_name["TokenizerService"].full_name),
        server,
    )
    address = f"{host}:{port}"
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot listen on {host}:{port}")
    for health_name in ("", name):
        await health_servicer.set(health_name, health_pb2.HealthCheckResponse.NOT_SERVING)
    await health_servicer.set(LIVENESS, health_pb2.HealthCheckResponse.SERVING)
    await server.start()
    log.info("%s listening on %s:%d%s", name, host, bound, " (TLS)" if credentials else "")
    watcher = asyncio.create_task(_watch_readiness(spec.models, health_servicer, ("", name), triton))
    return RunningService(server, bound, health_servicer, watcher, triton, spec.servicer)


async def run_until_signalled(service: RunningService, grace_s: float) -> None:
    """Serve until SIGTERM or SIGINT, then drain and stop."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    before = handled_by_code()
    log.info("shutting down: draining %d RPCs in flight (grace %.0f s)", in_flight(), grace_s)
    await service.stop(grace_s)
    drained = {code: n - before.get(code, 0) for code, n in handled_by_code().items() if n > before.get(code, 0)}
    log.info("stopped: RPCs finished while draining: %s", drained or "none")
