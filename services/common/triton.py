"""Every call a service makes to Triton goes through here: clients per address, readiness, model
configuration, unary and streaming inference, and one mapping of Triton failures to gRPC codes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
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

# Triton's gRPC status (as tritonclient reports it) → what the caller sees. Triton's own INVALID_ARGUMENT
# means the service built a bad request (a configuration mismatch, not a client mistake): INTERNAL.
_BY_STATUS = {
    "StatusCode.UNAVAILABLE": grpc.StatusCode.UNAVAILABLE,  # Triton unreachable, or the model not ready
    "StatusCode.NOT_FOUND": grpc.StatusCode.UNAVAILABLE,  # the model is not loaded (e.g. being unloaded)
    "StatusCode.DEADLINE_EXCEEDED": grpc.StatusCode.DEADLINE_EXCEEDED,
    "StatusCode.RESOURCE_EXHAUSTED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "StatusCode.CANCELLED": grpc.StatusCode.CANCELLED,
}
# Failures of the model instance rather than of the request, which Triton reports as INTERNAL, or with no
# status at all inside a stream: a crashed Python-backend stub ("Stub process '...' is not healthy"), a
# model that is not ready or no longer loaded. Retrying shortly can succeed: UNAVAILABLE, not INTERNAL.
_INSTANCE_DOWN = ("is not healthy", "stub process", "not ready", "unknown model", "is not found")


READINESS_TIMEOUT_S = 2.0


class ReadinessUnknown(Exception):
    """A readiness check that Triton did not answer in time: Triton may be busy or stuck."""


def triton_error(exc: InferenceServerException, model: str) -> ServiceError:
    """Map a Triton failure to what the caller should see: by tritonclient's status code first; the
    message decides only where the status cannot (INTERNAL, or none)."""
    status = str(exc.status() or "")
    message = exc.message() or str(exc)
    code = _BY_STATUS.get(status)
    if code is None and status in ("", "StatusCode.INTERNAL", "StatusCode.UNKNOWN"):
        lowered = message.lower()
        code = grpc.StatusCode.UNAVAILABLE if any(marker in lowered for marker in _INSTANCE_DOWN) else None
    if code == grpc.StatusCode.UNAVAILABLE:
        return ServiceError(code, f"Triton model `{model}` is unavailable: {message}")
    return ServiceError(code or grpc.StatusCode.INTERNAL, f"Triton failed on model `{model}`: {message}")


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
    """One aio client per Triton gRPC address, shared by all models of a service."""

    def __init__(self, timeout_s: float = 60.0) -> None:
        self._clients: dict[str, InferenceServerClient] = {}
        self.timeout_s = timeout_s  # for calls that carry no deadline of their own
        self._unreachable = asyncio.Event()
        self._failed_models: set[tuple[str, str]] = set()  # (url, model) found unavailable since the last check

    def _failed(self, exc: InferenceServerException, url: str, model: str) -> ServiceError:
        """The error to raise. One that says Triton or the model is unavailable wakes `wait_unreachable`,
        and the model's next readiness check reports it not ready (its service goes NOT_SERVING until a
        later check finds the model ready again)."""
        error = triton_error(exc, model)
        if error.code == grpc.StatusCode.UNAVAILABLE:
            self._failed_models.add((url, model))
            self._unreachable.set()
        return error

    async def wait_unreachable(self, timeout: float) -> None:
        """Return when an inference call has found Triton (or a model) unavailable, or after `timeout`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._unreachable.wait(), timeout)
        self._unreachable.clear()

    def client(self, url: str) -> InferenceServerClient:
        if url not in self._clients:
            self._clients[url] = InferenceServerClient(url, channel_args=_CHANNEL_ARGS)
        return self._clients[url]

    async def close(self) -> None:
        for client in self._clients.values():
            await client.close()
        self._clients.clear()

    async def why_not_ready(self, url: str, model: str) -> str | None:
        """None when Triton has the model ready, else why not; ReadinessUnknown when Triton does not answer
        in time. Not ready once after an inference found the model unavailable (Triton may report a model
        ready while its crashed instance is being restarted)."""
        if (url, model) in self._failed_models:
            self._failed_models.discard((url, model))
            return "an inference found it unavailable"
        try:
            ready = await self.client(url).is_model_ready(model, client_timeout=READINESS_TIMEOUT_S)
        except InferenceServerException as exc:
            if exc.status() == str(grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ReadinessUnknown(f"no answer within {READINESS_TIMEOUT_S:.0f} s") from None
            # The status only: no addresses or stack in a client's error.
            return f"Triton did not answer ({exc.status() or 'no status'})"
        return None if ready else "Triton reports it not ready"

    async def model_config(self, url: str, model: str) -> dict[str, Any]:
        try:
            response = await self.client(url).get_model_config(model, as_json=True, client_timeout=5.0)
        except InferenceServerException as exc:
            raise triton_error(exc, model) from None
        config: dict[str, Any] = response["config"]
        return config

    async def infer(
        self,
        url: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        timeout: float | None = None,
        request_id: str = "",
    ) -> dict[str, np.ndarray]:
        """One unary inference; returns the requested outputs as numpy arrays."""
        with triton_call(model):
            try:
                result: InferResult = await self.client(url).infer(
                    model,
                    [make_input(name, array) for name, array in inputs.items()],
                    outputs=[InferRequestedOutput(name) for name in outputs],
                    client_timeout=timeout or self.timeout_s,
                    request_id=request_id,
                )
            except InferenceServerException as exc:
                raise self._failed(exc, url, model) from None
        return {name: result.as_numpy(name) for name in outputs}

    async def stream(
        self,
        url: str,
        model: str,
        inputs: Mapping[str, np.ndarray],
        outputs: list[str],
        timeout: float | None = None,
        request_id: str = "",
    ) -> AsyncIterator[dict[str, np.ndarray]]:
        """One request on its own decoupled stream; yields each response's outputs. The stream's end
        is the request's end (tritonclient cannot ask for Triton's empty final response). Closing or
        cancelling the iterator cancels the call, which cancels the request inside Triton."""

        async def requests() -> AsyncIterator[dict[str, Any]]:
            yield {
                "model_name": model,
                "inputs": [make_input(name, array) for name, array in inputs.items()],
                "outputs": [InferRequestedOutput(name) for name in outputs],
                "request_id": request_id,
            }

        call = self.client(url).stream_infer(requests(), stream_timeout=timeout)
        with triton_call(model):
            try:
                async for result, error in call:
                    if error is not None:
                        raise self._failed(error, url, model)
                    yield outputs_of(result, outputs)
            except InferenceServerException as exc:
                raise self._failed(exc, url, model) from None
            except grpc.aio.AioRpcError as exc:  # the stream's own failure (e.g. Triton unreachable) comes raw
                raise self._failed(InferenceServerException(exc.details(), str(exc.code())), url,
                                   model) from None
            finally:
                call.cancel()
