"""How Triton failures map to gRPC codes (services/common/triton.py): by tritonclient's status code, and
a crashed or unloaded model instance is UNAVAILABLE (a 503 to retry), not INTERNAL."""

from __future__ import annotations

from unittest import mock

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from services.common.triton import ReadinessUnknown, Triton, triton_error
from services.common.triton_pool import TritonPool
from tritongate.triton_address import TritonAddress

STUB_DOWN = "Failed to process the request(s) for model instance 'm_0_0', message: Stub process 'm_0_0' is not healthy."


@pytest.mark.parametrize(("status", "message", "code"), [
    ("StatusCode.UNAVAILABLE", "failed to connect to all addresses", grpc.StatusCode.UNAVAILABLE),
    ("StatusCode.NOT_FOUND", "Request for unknown model: 'm' is not found", grpc.StatusCode.UNAVAILABLE),
    ("StatusCode.DEADLINE_EXCEEDED", "Deadline Exceeded", grpc.StatusCode.DEADLINE_EXCEEDED),
    ("StatusCode.RESOURCE_EXHAUSTED", "Exceeds maximum queue size", grpc.StatusCode.RESOURCE_EXHAUSTED),
    ("StatusCode.CANCELLED", "Locally cancelled by application!", grpc.StatusCode.CANCELLED),
    ("StatusCode.INTERNAL", STUB_DOWN, grpc.StatusCode.UNAVAILABLE),
    (None, STUB_DOWN, grpc.StatusCode.UNAVAILABLE),  # inside a stream, tritonclient gives no status
    (None, "Request for unknown model: 'm' has no available versions", grpc.StatusCode.UNAVAILABLE),
    ("StatusCode.INTERNAL", "model 'm' is not ready", grpc.StatusCode.UNAVAILABLE),
    ("StatusCode.INTERNAL", "ZeroDivisionError: division by zero", grpc.StatusCode.INTERNAL),
    (None, "TypeError in model.py", grpc.StatusCode.INTERNAL),
    # Triton's own checks refusing the request the service built: a configuration mismatch, the service's fault.
    ("StatusCode.INVALID_ARGUMENT", "input 'x' is not found in model 'm'", grpc.StatusCode.INTERNAL),
    ("StatusCode.INVALID_ARGUMENT", "[request id: <id_unknown>] unexpected inference input 'min_tokens' for model "
                                    "'m'", grpc.StatusCode.INTERNAL),
    ("StatusCode.INVALID_ARGUMENT", "inference input 'input_ids' data-type is 'INT32', but model 'm' expects "
                                    "'UINT32'", grpc.StatusCode.INTERNAL),
    ("StatusCode.INVALID_ARGUMENT", "[request id: 7] expected 3 inputs but got 2 inputs for model 'm'. Got input(s) "
                                    "['a', 'b'], but missing required input(s) ['c']", grpc.StatusCode.INTERNAL),
    # The model refused the request's values (a Python backend's TritonError.INVALID_ARG): the client's.
    ("StatusCode.INVALID_ARGUMENT", "beam_width=3: this model supports 1 only", grpc.StatusCode.INVALID_ARGUMENT),
    # Inside a stream (no status), and from backends that refuse with INTERNAL: told by their words on the
    # first line, before anything was generated.
    (None, "[FT][ERROR] beam_width=3: this model supports 1 only", grpc.StatusCode.INVALID_ARGUMENT),
    (None, "[TensorRT-LLM][ERROR] Assertion failed: mMaxNewTokens > 0 (samplingConfig.cpp:42)",
     grpc.StatusCode.INVALID_ARGUMENT),
    ("StatusCode.INTERNAL", "Error generating stream: top_p must be in (0, 1], got 0.0.",
     grpc.StatusCode.INVALID_ARGUMENT),
    # ... but not their runtime's faults.
    (None, "Executor failed process requestId 3 due to the following error: [TensorRT-LLM][ERROR] Assertion "
           "failed: OOM", grpc.StatusCode.INTERNAL),
    (None, "Error encountered while populating response: [TensorRT-LLM][ERROR] sequence_length tensor must be "
           "present in list of output tensors", grpc.StatusCode.INTERNAL),
    (None, "Error generating stream: CUDA out of memory. Tried to allocate 2.00 GiB", grpc.StatusCode.INTERNAL),
    (None, "Error generating stream: Background loop has errored already.", grpc.StatusCode.INTERNAL),
    (None, "[FT][ERROR] CUDA runtime error: out of memory /src/fastertransformer/utils/allocator.h:181",
     grpc.StatusCode.INTERNAL),
    (None, "beam_width=3: this model supports 1 only", grpc.StatusCode.INTERNAL),  # no status, no words: unknown
])
def test_triton_failures_map_by_status_then_by_what_failed(status: str | None, message: str,
                                                           code: grpc.StatusCode) -> None:
    error = triton_error(InferenceServerException(message, status), "m")
    assert error.code == code
    assert "`m`" in error.message and message.splitlines()[0] in error.message


def test_a_refusal_names_the_parameter_its_words_name_and_never_a_traceback() -> None:
    error = triton_error(InferenceServerException("Error generating stream: top_p must be in (0, 1], got 0.0.\n"
                                                  "Traceback (most recent call last): ...", "StatusCode.INTERNAL"), "m")
    assert error.param == "top_p" and "Traceback" not in error.message
    assert error.message == \
        "Triton model `m` refused the request: Error generating stream: top_p must be in (0, 1], got 0.0."
    assert triton_error(InferenceServerException("Error generating stream: min_tokens must be less than or equal to "
                                                 "max_tokens=16, got 20."), "m").param == "min_tokens"
    assert triton_error(InferenceServerException("[TensorRT-LLM][ERROR] Assertion failed: mMaxNewTokens > 0"),
                        "m").param == "max_tokens"
    assert triton_error(InferenceServerException("a picture is required", "StatusCode.INVALID_ARGUMENT"),
                        "m").param is None


def test_an_error_after_the_model_answered_is_its_failure_not_a_refusal() -> None:
    """A backend that sends every error as INTERNAL failing mid-generation: what it generated was accepted."""
    failure = InferenceServerException("Error generating stream: m: injected error after 3 tokens",
                                       "StatusCode.INTERNAL")
    assert triton_error(failure, "m").code == grpc.StatusCode.INVALID_ARGUMENT
    assert triton_error(failure, "m", answered=True).code == grpc.StatusCode.INTERNAL
    refused = InferenceServerException("the image is too large", "StatusCode.INVALID_ARGUMENT")  # said outright
    assert triton_error(refused, "m", answered=True).code == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_model_found_unavailable_is_not_ready_until_checked_again() -> None:
    triton = Triton()
    pool = TritonPool([TritonAddress("127.0.0.1", 1)], "m")
    [endpoint] = pool
    ready = mock.AsyncMock(return_value=None)  # Triton has the model ready
    assert await pool.refresh(ready) is None
    triton._failed(InferenceServerException("bad input", "StatusCode.INTERNAL"), pool, endpoint, "m")
    assert endpoint.ready and not triton._unreachable.is_set()  # a failed request is not a failed model
    triton._failed(InferenceServerException(STUB_DOWN, "StatusCode.INTERNAL"), pool, endpoint, "m")
    assert not endpoint.ready and triton._unreachable.is_set()  # the readiness watcher wakes at once
    ready.reset_mock()
    assert await pool.refresh(ready) == "an inference found it unavailable"
    ready.assert_not_called()  # Triton may call the model ready while its crashed instance restarts
    # The next check asks Triton again (none there).
    assert await pool.refresh(lambda address: triton.why_not_ready(address, "m")) == \
        "Triton did not answer (StatusCode.UNAVAILABLE)"
    await triton.close()


async def test_a_readiness_check_without_an_answer_in_time_is_unknown_not_unready() -> None:
    class SlowClient:
        async def is_model_ready(self, model: str, client_timeout: float) -> bool:
            raise InferenceServerException("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED")

    triton = Triton()
    triton._clients["127.0.0.1:1"] = SlowClient()  # type: ignore[assignment]
    with pytest.raises(ReadinessUnknown):
        await triton.why_not_ready("127.0.0.1:1", "m")
