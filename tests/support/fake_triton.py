"""The one fake Triton of the unit tests, behind Triton's own gRPC interface.

`FakeTriton` is a real gRPC server (grpc.aio, on a free port of 127.0.0.1) implementing Triton's
`inference.GRPCInferenceService` from tritonclient's own service protos, so the services' Triton client
(services/common/triton.py on tritonclient's aio client) runs unchanged against it: readiness, model
configuration, unary inference and decoupled streams. It serves `FakeModel`s, each a configuration (in
the JSON shape `get_model_config` gives) and its answer to one request: the responses' output arrays, or
a function of the request's input arrays giving them (one response for a unary call, any number on a
stream), or `Refused` to fail the way Triton does. It records every request it gets (`requests`).

Three deterministic models stand in for the demo models, on their real configurations:
`embedding_model` (deploy/triton/all-minilm-l6-v2: hidden states for the embed service to pool),
`rerank_model` (deploy/triton/minilm-rerank: one logit per query-document pair, from their shared tokens)
and `ft_echo_model` (tests/triton_models/ft-echo: the FasterTransformer interface, streamed, whose
continuation repeats the prompt until the end id or `request_output_len`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
from google.protobuf import json_format, text_format
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from edge.app import create_app
from services.common.server import RunningService, start_service
from services.common.triton import Triton
from services.common.triton_pool import TritonPool
from services.runner import build_service
from tritongate.config import ModelConfig, parse_model_config
from tritongate.registry import SERVICES
from tritongate.settings import Settings
from tritongate.triton_address import parse_triton_address

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
Arrays = dict[str, np.ndarray]
Answer = Callable[[Mapping[str, np.ndarray]], Iterable[Arrays]]


class Refused(Exception):
    """What a model's answer raises to fail as Triton fails: a status on a unary call, an error message
    inside a stream."""

    def __init__(self, message: str, code: grpc.StatusCode = grpc.StatusCode.INTERNAL) -> None:
        super().__init__(message)
        self.message, self.code = message, code


@dataclass
class FakeModel:
    config: dict[str, Any]
    answer: Answer | list[Arrays] = field(default_factory=list)  # the responses, or a function giving them
    ready: bool | None = True  # None: the readiness check gets no answer

    def responses(self, inputs: Mapping[str, np.ndarray]) -> Iterable[Arrays]:
        return self.answer(inputs) if callable(self.answer) else self.answer


@dataclass
class Received:
    model: str
    inputs: Arrays
    outputs: list[str]
    request_id: str
    priority: int = 0  # the request's priority level (0: the model's default)


def triton_config(inputs: Mapping[str, str], outputs: Mapping[str, str], *, batched: bool = True,
                  decoupled: bool = True, **extra: Any) -> dict[str, Any]:
    """A model configuration in get_model_config's JSON shape, from tensor names and types (without TYPE_)."""
    config: dict[str, Any] = {
        "name": "m",
        "input": [{"name": name, "data_type": f"TYPE_{kind}"} for name, kind in inputs.items()],
        "output": [{"name": name, "data_type": f"TYPE_{kind}"} for name, kind in outputs.items()],
        **extra,
    }
    if batched:
        config["max_batch_size"] = 8
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return config


def pbtxt_config(path: Path) -> dict[str, Any]:
    """A config.pbtxt in get_model_config's JSON shape."""
    config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
    return json_format.MessageToDict(config, preserving_proto_field_name=True)


def texts(*pieces: str) -> list[Arrays]:
    """Responses of a text backend: one `text_output` each, batched as [1, 1]."""
    return [{"text_output": np.array([[piece.encode()]], dtype=np.object_)} for piece in pieces]


def _arrays(request: service_pb2.ModelInferRequest) -> Arrays:
    arrays = {}
    for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True):
        array = deserialize_bytes_tensor(raw) if tensor.datatype == "BYTES" else \
            np.frombuffer(raw, dtype=triton_to_np_dtype(tensor.datatype))
        arrays[tensor.name] = array.reshape(list(tensor.shape))
    return arrays


def _response(request: service_pb2.ModelInferRequest, arrays: Arrays) -> service_pb2.ModelInferResponse:
    """The outputs the request asked for (all when it named none), in Triton's raw form."""
    wanted = {output.name for output in request.outputs}
    response = service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)
    for name, array in arrays.items():
        if wanted and name not in wanted:
            continue
        datatype = np_to_triton_dtype(array.dtype)
        response.outputs.add(name=name, datatype=datatype, shape=list(array.shape))
        if datatype == "BYTES":
            serialized = serialize_byte_tensor(array)
            response.raw_output_contents.append(serialized.item() if serialized.size else b"")
        else:
            response.raw_output_contents.append(np.ascontiguousarray(array).tobytes())
    return response


class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):
    """Triton's gRPC service for `models`; `async with FakeTriton(...) as triton:` serves it on
    `triton.address` (host:port), with `triton.client`, the services' own Triton client, to call it."""

    def __init__(self, models: Mapping[str, FakeModel]) -> None:
        self.models = dict(models)
        self.requests: list[Received] = []
        self.address = ""
        self.client = Triton()
        self._server: grpc.aio.Server | None = None

    async def __aenter__(self) -> FakeTriton:
        self._server = grpc.aio.server()
        service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(self, self._server)
        port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.address = f"127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.close()
        if self._server is not None:
            await self._server.stop(None)

    async def pool(self, model: str) -> TritonPool:
        """`model`'s pool of Triton endpoints (this Triton alone), checked ready, as a service's model holds it."""
        pool = TritonPool([parse_triton_address(self.address)], model)
        await pool.refresh(lambda address: self.client.why_not_ready(address, model))
        return pool

    async def calling(self, model: str) -> tuple[Triton, TritonPool]:
        """What an LLM adapter takes to call `model` here: the Triton client and the model's Triton pool."""
        return self.client, await self.pool(model)

    async def _model(self, name: str, context: grpc.aio.ServicerContext) -> FakeModel:
        if name not in self.models:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{name}' is not found")
        return self.models[name]

    def _answer(self, request: service_pb2.ModelInferRequest) -> Iterable[service_pb2.ModelInferResponse]:
        inputs = _arrays(request)
        self.requests.append(Received(request.model_name, inputs, [o.name for o in request.outputs], request.id,
                                      request.parameters["priority"].uint64_param
                                      if "priority" in request.parameters else 0))
        for arrays in self.models[request.model_name].responses(inputs):
            yield _response(request, arrays)

    async def ServerLive(self, request: service_pb2.ServerLiveRequest, context: grpc.aio.ServicerContext
                         ) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    async def ServerReady(self, request: service_pb2.ServerReadyRequest, context: grpc.aio.ServicerContext
                          ) -> service_pb2.ServerReadyResponse:
        return service_pb2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: service_pb2.ModelReadyRequest, context: grpc.aio.ServicerContext
                         ) -> service_pb2.ModelReadyResponse:
        model = self.models.get(request.name)
        if model is not None and model.ready is None:
            await asyncio.Event().wait()  # until the client gives up
        return service_pb2.ModelReadyResponse(ready=model is not None and bool(model.ready))

    async def ModelConfig(self, request: service_pb2.ModelConfigRequest, context: grpc.aio.ServicerContext
                          ) -> service_pb2.ModelConfigResponse:
        model = await self._model(request.name, context)
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(model.config,
                                                                            model_config_pb2.ModelConfig()))

    async def ModelInfer(self, request: service_pb2.ModelInferRequest, context: grpc.aio.ServicerContext
                         ) -> service_pb2.ModelInferResponse:
        await self._model(request.model_name, context)
        try:
            return next(iter(self._answer(request)))
        except Refused as exc:
            await context.abort(exc.code, exc.message)
            raise  # abort raises; this line is for the type checker

    async def ModelStreamInfer(self, requests: AsyncIterator[service_pb2.ModelInferRequest],
                               context: grpc.aio.ServicerContext
                               ) -> AsyncIterator[service_pb2.ModelStreamInferResponse]:
        async for request in requests:
            await self._model(request.model_name, context)
            try:
                for response in self._answer(request):
                    yield service_pb2.ModelStreamInferResponse(infer_response=response)
            except Refused as exc:
                yield service_pb2.ModelStreamInferResponse(error_message=exc.message)


# The stand-ins of the demo models.

def embedding_model() -> FakeModel:
    """Hidden states [batch, seq, 384] that depend on each token id alone (masked), and their mean as the
    sentence embedding."""
    config = pbtxt_config(REPO / "deploy" / "triton" / "all-minilm-l6-v2" / "config.pbtxt")
    width = 384

    def answer(inputs: Mapping[str, np.ndarray]) -> Iterable[Arrays]:
        ids, mask = inputs["input_ids"], inputs["attention_mask"].astype(np.float32)
        hidden = np.sin(ids[..., None] * np.arange(1, width + 1, dtype=np.float32) / width) * mask[..., None]
        mean = hidden.sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1)
        yield {"last_hidden_state": hidden.astype(np.float32), "sentence_embedding": mean.astype(np.float32)}

    return FakeModel(config, answer)


def rerank_model() -> FakeModel:
    """One logit per pair: higher the more of the document's tokens the query has."""
    config = pbtxt_config(REPO / "deploy" / "triton" / "minilm-rerank" / "config.pbtxt")

    def answer(inputs: Mapping[str, np.ndarray]) -> Iterable[Arrays]:
        logits = []
        for ids, mask, types in zip(inputs["input_ids"], inputs["attention_mask"], inputs["token_type_ids"],
                                    strict=True):
            query, document = set(ids[(mask == 1) & (types == 0)]), set(ids[(mask == 1) & (types == 1)])
            logits.append([4.0 * len(query & document) / max(len(document), 1) - 2.0])
        yield {"logits": np.array(logits, dtype=np.float32)}

    return FakeModel(config, answer)


def ft_echo_model() -> FakeModel:
    """FasterTransformer's streaming: one new token per response, each response the whole sequence so far
    (prompt included) padded with the end id to prompt + request_output_len; token i of the continuation
    is prompt token i (cyclically), and an end id ends it (kept, as FT keeps it)."""
    config = pbtxt_config(TESTS / "triton_models" / "ft-echo" / "config.pbtxt")
    default_end_id = int(config["parameters"]["default_end_id"]["string_value"])

    def answer(inputs: Mapping[str, np.ndarray]) -> Iterable[Arrays]:
        prompt = inputs["input_ids"].reshape(-1)[: int(inputs["input_lengths"].reshape(-1)[0])].tolist()
        max_new = int(inputs["request_output_len"].reshape(-1)[0])
        end_id = int(inputs["end_id"].reshape(-1)[0]) if "end_id" in inputs else default_end_id
        log_probs = bool(inputs["is_return_log_probs"].reshape(-1)[0]) if "is_return_log_probs" in inputs else False
        sequence = list(prompt)
        for i in range(max_new):
            sequence.append(prompt[i % len(prompt)])
            ids = np.full((1, 1, len(prompt) + max_new), end_id, dtype=np.uint32)
            ids[0, 0, : len(sequence)] = sequence
            response: Arrays = {"output_ids": ids, "sequence_length": np.array([[len(sequence)]], dtype=np.uint32)}
            if log_probs:
                per_token = np.zeros((1, 1, max_new), dtype=np.float32)
                per_token[0, 0, : i + 1] = [-0.1 * (k + 1) for k in range(i + 1)]
                response["output_log_probs"] = per_token
            yield response
            if sequence[-1] == end_id:
                return

    return FakeModel(config, answer)


# The whole stack in this process: the fake Triton, the three services on port 0, the edge app in memory.

DEMO_MODELS = {"all-minilm-l6-v2": embedding_model, "minilm-rerank": rerank_model, "ft-echo": ft_echo_model}


def model_config(triton: str, models_dir: Path) -> ModelConfig:
    """One model of each kind on the fake Triton at `triton`, with the demo models' tokenizers."""
    encoder = {"url": triton, "path": str(models_dir / "all-minilm-l6-v2"), "max_tokens": 256}
    return parse_model_config({
        "model_infos": [{"name": "ft-echo", "max_len": 256}],
        "llm": [{"name": "ft-echo", "url": triton, "path": str(models_dir / "smollm2-135m-instruct")}],
        "embedding": [{**encoder, "name": "all-minilm-l6-v2", "output_name": "last_hidden_state"}],
        "rerank": [{**encoder, "name": "minilm-rerank"}],
    })


@dataclass
class InProcessStack:
    triton: FakeTriton
    services: dict[str, RunningService]
    edge: httpx.AsyncClient


async def _until_serving(port: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        for _ in range(200):
            answer = await health.Check(health_pb2.HealthCheckRequest())
            if answer.status == health_pb2.HealthCheckResponse.SERVING:
                return
            await asyncio.sleep(0.05)
    raise AssertionError(f"the service on port {port} never became SERVING")


@asynccontextmanager
async def in_process_stack(models_dir: Path) -> AsyncIterator[InProcessStack]:
    """The fake Triton with the demo models' stand-ins, the llm, embed and rerank services (each as its
    runner builds it, on port 0) once serving, and an httpx client on the edge app (over ASGI, no port)
    pointed at them."""
    async with FakeTriton({name: make() for name, make in DEMO_MODELS.items()}) as triton:
        config = model_config(triton.address, models_dir)
        services: dict[str, RunningService] = {}
        try:
            for service in SERVICES:
                client = Triton()
                services[service.name] = await start_service(build_service(service, config, client), client,
                                                             host="127.0.0.1", port=0)
            await asyncio.gather(*(_until_serving(running.port) for running in services.values()))
            targets: dict[str, Any] = {f"{name}_target": f"127.0.0.1:{running.port}"
                                       for name, running in services.items()}
            settings = Settings(state_url="memory://", **targets)
            app = create_app(settings)
            async with app.router.lifespan_context(app), httpx.AsyncClient(
                    transport=httpx.ASGITransport(app=app), base_url="http://edge", timeout=30) as edge:
                yield InProcessStack(triton, services, edge)
        finally:
            for running in services.values():
                await running.stop(None)
