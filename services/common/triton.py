"""Every call a service makes to Triton goes through here: clients per address, readiness, model
configuration, unary and streaming inference spread over a model's pool of Triton endpoints
(services/common/triton_pool.py), and one mapping of Triton failures to gRPC codes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Iterator, Mapping
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import InferInput, InferRequestedOutput, InferResult
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import (
    InferenceServerException,
    deserialize_bytes_tensor,
    np_to_triton_dtype,
    triton_to_np_dtype,
)

from services.common.errors import ServiceError
from services.common.metrics import triton_call
from services.common.prefix_routing import ROUTE, RoutingRule
from services.common.triton_pool import DEFAULT_RESOLVE_EVERY_S, Endpoint, ReadinessUnknown, TritonPool
from tritongate.wire import MAX_MESSAGE_BYTES

log = logging.getLogger(__name__)

_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # Reconnect attempts back off to 120 s by default: a Triton that comes back would go unnoticed that long.
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
]

INVALID_ARGUMENT = "StatusCode.INVALID_ARGUMENT"
_FAILED = frozenset({"StatusCode.INTERNAL", "StatusCode.UNKNOWN", ""})  # "": inside a stream, no status
# Triton's failures (its gRPC status as tritonclient reports it, and words of its message, lower case) → what
# the caller sees; the first rule that matches decides, and a failure no rule matches is INTERNAL. A
# refusal (INVALID_ARGUMENT) is the client's: a 400 with the model's reason; a fault on this side stays 5xx.
_RULES: tuple[tuple[frozenset[str], tuple[str, ...], grpc.StatusCode], ...] = (
    (frozenset({"StatusCode.UNAVAILABLE"}), (), grpc.StatusCode.UNAVAILABLE),  # Triton unreachable, or not ready
    (frozenset({"StatusCode.NOT_FOUND"}), (), grpc.StatusCode.UNAVAILABLE),  # the model is not loaded (unloading)
    (frozenset({"StatusCode.DEADLINE_EXCEEDED"}), (), grpc.StatusCode.DEADLINE_EXCEEDED),
    (frozenset({"StatusCode.RESOURCE_EXHAUSTED"}), (), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (frozenset({"StatusCode.CANCELLED"}), (), grpc.StatusCode.CANCELLED),
    # Triton's own checks of a request against the model's configuration: the service built a request the
    # model's config.pbtxt does not take (a configuration mismatch, not the client's mistake).
    (frozenset({INVALID_ARGUMENT}), ("unexpected inference input", "unexpected inference output", "inputs but got",
                                     "missing required input", "data-type is", "unexpected shape for input",
                                     "byte size mismatch", "batch-size must be", "unexpected number of string",
                                     "is not found in model"), grpc.StatusCode.INTERNAL),
    # The model refused the request's values (a Python backend's TritonError.INVALID_ARG, the demo models').
    (frozenset({INVALID_ARGUMENT}), (), grpc.StatusCode.INVALID_ARGUMENT),
    # The model instance failed, not the request: a crashed Python-backend stub ("Stub process '...' is not
    # healthy"), a model not ready or no longer loaded. Retrying shortly can succeed.
    (_FAILED, ("is not healthy", "stub process", "not ready", "unknown model", "is not found"),
     grpc.StatusCode.UNAVAILABLE),
)
# Inside a stream Triton sends an error response's message without its code (a Python-backend model's
# TritonError.INVALID_ARG arrives as its message alone), and real backends send their refusals as INTERNAL:
# the FasterTransformer and TensorRT-LLM backends check a request as they enqueue it and fail it with the
# library's exception ("[FT][ERROR] ...", "[TensorRT-LLM][ERROR] Assertion failed: mMaxNewTokens > 0"), the
# vLLM backend wraps its SamplingParams and prompt checks in "Error generating stream: ...". So a refusal is
# told by those words too, but only on the message's first line, only before the model's first response
# (an error after output is the generation's failure), and never where the words name a fault of the
# runtime: TensorRT-LLM's executor ("Executor failed ...") or its output handling, the device, vLLM's engine.
# (Triton's `triton_grpc_error` header would end a stream with the code instead, but Triton 2.51 crashes
# when a model sends its final flag apart after an error response, as TensorRT-LLM's ensemble does.)
_REFUSALS = ("[ft][error]", "[tensorrt-llm][error]", "error generating stream: ")
_FAULTS = ("executor failed", "error encountered while populating response", "out of memory", "cuda error",
           "cuda runtime error", "enginecore", "enginedeaderror", "engine is dead", "background loop")

READINESS_TIMEOUT_S = 2.0
CLIENT_IDLE_S = 60.0  # a client unused this long is closed: no model has its address any more


def triton_error(exc: InferenceServerException, model: str, answered: bool = False) -> ServiceError:
    """Map a Triton failure to what the caller should see (`_RULES`, then a refusal told by its words
    while the model has not `answered`); a refusal carries the model's reason, and the request parameter
    it names where the words tell (`refused_param`)."""
    status = str(exc.status() or "")
    message = exc.message() or str(exc)
    lowered = message.lower()
    code = next((code for statuses, markers, code in _RULES
                 if status in statuses and (not markers or any(marker in lowered for marker in markers))), None)
    first_line = lowered.strip().split("\n", 1)[0]
    if code is None and status in _FAILED and not answered and any(m in first_line for m in _REFUSALS) \
            and not any(fault in first_line for fault in _FAULTS):
        code = grpc.StatusCode.INVALID_ARGUMENT
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServiceError(code, f"Triton model `{model}` is unavailable: {message}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        reason = message.strip().splitlines()[0] if message.strip() else status  # never a traceback
        return ServiceError(code, f"Triton model `{model}` refused the request: {reason}",
                            refused_param(reason.lower()))
    if status == INVALID_ARGUMENT:
        log.error("Triton model %s does not take the request the service built (a configuration mismatch: check "
                  "the model's entry against its config.pbtxt): %s", model, message)
    return ServiceError(code or grpc.StatusCode.INTERNAL, f"Triton failed on model `{model}`: {message}")


# Words of a refusal's first line (a backend's own names of its inputs and parameters) → the generation
# request's parameter they stand for, named in the error; the first found wins.
_PARAMS = (
    (("min_tokens", "min_length", "mmintokens"), "min_tokens"),  # before max_tokens, which its rules name
    (("mmaxnewtokens", "max_tokens", "request_output_len", "output_len"), "max_tokens"),
    (("temperature",), "temperature"),
    (("top_p", "topp"), "top_p"),
    (("top_k", "topk"), "top_k"),
    (("presence_penalty",), "presence_penalty"),
    (("frequency_penalty",), "frequency_penalty"),
    (("repetition_penalty",), "repetition_penalty"),
    (("beam_width", "beamwidth", "num_beams"), "num_beams"),
    (("logit_bias", "embedding_bias"), "logit_bias"),
    (("seed",), "seed"),
    (("stop",), "stop"),
    (("image",), "messages"),
)


def refused_param(lowered: str) -> str | None:
    return next((param for words, param in _PARAMS if any(word in lowered for word in words)), None)


def make_input(name: str, array: np.ndarray) -> InferInput:
    tensor = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def outputs_of(result: InferResult, names: list[str]) -> dict[str, np.ndarray]:
    """The named outputs that `result` has, as numpy arrays over its bytes. One pass over the response
    (`as_numpy` searches it once per name): on a stream this runs for every token."""
    response = result.get_response()
    if len(response.raw_output_contents) != len(response.outputs):  # not in Triton's raw form
        return {name: result.as_numpy(name) for name in names if result.get_output(name)}
    arrays = {}
    for output, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        if output.name in names:
            array = deserialize_bytes_tensor(raw) if output.datatype == "BYTES" else \
                np.frombuffer(raw, dtype=triton_to_np_dtype(output.datatype))
            arrays[output.name] = array.reshape(output.shape)
    return arrays


class Triton:
    """One aio client per Triton gRPC address, shared by all models of a service. Inference goes to the
    endpoint of the model's `TritonPool` that `pick` chooses; an UNAVAILABLE answer takes that endpoint out
    of the rotation, and is retried once on another ready endpoint where that is safe (a unary call; a
    stream before its first response)."""

    def __init__(self, timeout_s: float = 60.0, resolve_every_s: float = DEFAULT_RESOLVE_EVERY_S,
                 routing: RoutingRule | None = None) -> None:
        self._clients: dict[str, InferenceServerClient] = {}
        self._used: dict[str, float] = {}  # when each client was last used (monotonic)
        self._busy: Counter[str] = Counter()  # inference calls in flight per address
        self.timeout_s = timeout_s  # for calls that carry no deadline of their own
        self.resolve_every_s = resolve_every_s  # how often the models' DNS names are looked up again
        self.routing = routing or RoutingRule()  # for calls bound to a generation's `ROUTE`
        self._unreachable = asyncio.Event()

    def _failed(self, exc: InferenceServerException, pool: TritonPool, endpoint: Endpoint,
                model: str, answered: bool = False) -> ServiceError:
        """The error to raise (`answered`: the model had responded). One that says Triton or the model is
        unavailable takes the endpoint out of the model's rotation and wakes `wait_unreachable` (the model's
        readiness is checked again at once)."""
        error = triton_error(exc, model, answered)
        if error.code == grpc.StatusCode.UNAVAILABLE:
            pool.found_unavailable(endpoint, exc.message() or str(exc))
            self._unreachable.set()
        return error

    def _pick(self, pool: TritonPool, model: str) -> Endpoint:
        endpoint = pool.pick(route=ROUTE.get(), rule=self.routing)
        if endpoint is None:
            self._unreachable.set()
            raise ServiceError(grpc.StatusCode.UNAVAILABLE,
                               f"Triton model `{model}` is unavailable: no Triton endpoint has it ready")
        return endpoint

    async def wait_unreachable(self, timeout: float) -> None:
        """Return when an inference call has found Triton (or a model) unavailable, or after `timeout`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._unreachable.wait(), timeout)
        self._unreachable.clear()

    def client(self, address: str) -> InferenceServerClient:
        if address not in self._clients:
            self._clients[address] = InferenceServerClient(address, channel_args=_CHANNEL_ARGS)
        self._used[address] = time.monotonic()
        return self._clients[address]

    @contextlib.contextmanager
    def _calling(self, pool: TritonPool, endpoint: Endpoint) -> Iterator[InferenceServerClient]:
        """The client for one call on `endpoint`, counted in flight there while the call lasts."""
        self._busy[endpoint.address] += 1
        try:
            with pool.calling(endpoint):
                yield self.client(endpoint.address)
        finally:
            self._busy[endpoint.address] -= 1

    async def close_idle(self) -> None:
        """Close the clients of addresses no model has any more (a Triton pod gone from DNS), once no call is
        in flight there: every address a model has gets a readiness check every few seconds."""
        idle = [address for address, used in self._used.items()
                if not self._busy[address] and time.monotonic() - used > CLIENT_IDLE_S]
        for address in idle:
            del self._used[address]
        for client in [self._clients.pop(address) for address in idle]:
            await client.close()

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()
        self._used.clear()

    async def why_not_ready(self, address: str, model: str) -> str | None:
        """None when Triton at `address` has the model ready, else why not; ReadinessUnknown when Triton does
        not answer in time."""
        try:
            ready = await self.client(address).is_model_ready(model, client_timeout=READINESS_TIMEOUT_S)
        except InferenceServerException as exc:
            if exc.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ReadinessUnknown(f"no answer within {READINESS_TIMEOUT_S:.0f} s") from None
            # The status only: no addresses or stack in a client's error.
            return f"Triton did not answer ({exc.status() or 'no status'})"
        return None if ready else "Triton reports it not ready"

    async def model_config(self, address: str, model: str) -> dict[str, Any]:
        try:
            response = await self.client(address).get_model_config(model, as_json=True, client_timeout=5.0)
        except InferenceServerException as exc:
            raise triton_error(exc, model) from None
        config: dict[str, Any] = response["config"]
        return config

    def _retry_at(self, error: ServiceError, pool: TritonPool, endpoint: Endpoint, model: str) -> Endpoint:
        """Where to try again a call that failed with `error` at `endpoint`: another ready endpoint, when
        the error says Triton or the model was unavailable there; else `error` is raised."""
        unavailable = error.code == grpc.StatusCode.UNAVAILABLE
        other = pool.pick(avoid=endpoint, route=ROUTE.get(), rule=self.routing) if unavailable else None
        if other is None:
            raise error
        log.info("Triton model %s unavailable at %s; trying %s", model, endpoint.address, other.address)
        return other

    async def infer(
        self,
        pool: TritonPool,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        timeout: float | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """One unary inference on one of the model's endpoints; returns the requested outputs as numpy
        arrays. Inference has no side effects: found unavailable, it is tried once more on another endpoint."""
        tensors = [make_input(name, array) for name, array in inputs.items()]
        requested = [InferRequestedOutput(name) for name in outputs]
        deadline = time.monotonic() + (timeout or self.timeout_s)

        async def infer_at(endpoint: Endpoint) -> InferResult:
            with self._calling(pool, endpoint) as client:
                try:
                    return await client.infer(
                        model, tensors, outputs=requested, client_timeout=max(0.0, deadline - time.monotonic()),
                        request_id=request_id)
                except InferenceServerException as exc:
                    raise self._failed(exc, pool, endpoint, model) from None

        with triton_call(model):
            endpoint = self._pick(pool, model)
            try:
                result = await infer_at(endpoint)
            except ServiceError as error:
                result = await infer_at(self._retry_at(error, pool, endpoint, model))
        return {name: result.as_numpy(name) for name in outputs}

    async def stream(
        self,
        pool: TritonPool,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        timeout: float | None = None,
        request_id: str = "",
        priority: int = 0,
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request on its own decoupled stream, on one of the model's endpoints; yields each response's
        outputs. The stream's end is the request's end (tritonclient cannot ask for Triton's empty final
        response). A stream found unavailable before its first response is tried once more on another
        endpoint; after it, the error goes to the caller (what was sent cannot be taken back). Closing or
        cancelling the iterator cancels the call, which cancels the request inside Triton."""
        deadline = None if timeout is None else time.monotonic() + timeout

        def stream_at(endpoint: Endpoint) -> contextlib.aclosing[AsyncGenerator[dict[str, np.ndarray], None]]:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            return contextlib.aclosing(self._stream_at(pool, endpoint, model, inputs, outputs, remaining,
                                                       request_id, priority))

        with triton_call(model):
            endpoint = self._pick(pool, model)
            answered = False
            try:
                async with stream_at(endpoint) as responses:
                    async for response in responses:
                        answered = True
                        yield response
                return
            except ServiceError as error:
                if answered:
                    raise
                endpoint = self._retry_at(error, pool, endpoint, model)
            async with stream_at(endpoint) as responses:
                async for response in responses:
                    yield response

    async def _stream_at(self, pool: TritonPool, endpoint: Endpoint, model: str,
                         inputs: Mapping[str, np.ndarray], outputs: list[str], timeout: float | None,
                         request_id: str, priority: int = 0) -> AsyncGenerator[dict[str, np.ndarray], None]:
        """The stream on one endpoint; Triton's failures as ServiceError."""

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": model,
                "inputs": [make_input(name, array) for name, array in inputs.items()],
                "outputs": [InferRequestedOutput(name) for name in outputs],
                "request_id": request_id,
                "priority": priority,  # the model's scheduler level (0: its default)
            }

        answered = False
        with self._calling(pool, endpoint) as client:
            call = client.stream_infer(requests(), stream_timeout=timeout)
            try:
                async for result, error in call:
                    if error is not None:
                        raise self._failed(error, pool, endpoint, model, answered)
                    answered = True
                    yield outputs_of(result, outputs)
            except InferenceServerException as exc:
                raise self._failed(exc, pool, endpoint, model, answered) from None
            except grpc.aio.AioRpcError as exc:  # the stream's own failure (e.g. Triton unreachable) comes raw
                raise self._failed(InferenceServerException(exc.details(), str(exc.code())), pool, endpoint,
                                   model, answered) from None
            finally:
                call.cancel()
