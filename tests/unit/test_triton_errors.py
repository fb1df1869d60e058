"""How Triton failures map to gRPC codes (services/common/triton.py): by tritonclient's status code, and
a crashed or unloaded model instance is UNAVAILABLE (a 503 to retry), not INTERNAL."""

from __future__ import annotations

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from services.common.triton import ReadinessUnknown, Triton, triton_error

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
    # The status decides first: Triton refusing the request the service built is the service's fault.
    ("StatusCode.INVALID_ARGUMENT", "input 'x' is not found in model 'm'", grpc.StatusCode.INTERNAL),
])
def test_triton_failures_map_by_status_then_by_what_failed(status: str | None, message: str,
                                                           code: grpc.StatusCode) -> None:
    error = triton_error(InferenceServerException(message, status), "m")
    assert error.code == code
    assert "`m`" in error.message and message in error.message


async def test_a_model_found_unavailable_is_not_ready_until_checked_again() -> None:
    triton = Triton()
    triton._failed(InferenceServerException(STUB_DOWN, "StatusCode.INTERNAL"), "127.0.0.1:1", "m")
    assert triton._unreachable.is_set()  # the readiness watcher wakes at once
    assert await triton.why_not_ready("127.0.0.1:1", "m") == "an inference found it unavailable"
    assert ("127.0.0.1:1", "m") not in triton._failed_models  # the next check asks Triton again (none there)
    assert await triton.why_not_ready("127.0.0.1:1", "m") == "Triton did not answer (StatusCode.UNAVAILABLE)"
    triton._failed(InferenceServerException("bad input", "StatusCode.INTERNAL"), "127.0.0.1:1", "m")
    assert ("127.0.0.1:1", "m") not in triton._failed_models  # a failed request is not a failed model
    await triton.close()


async def test_a_readiness_check_without_an_answer_in_time_is_unknown_not_unready() -> None:
    class SlowClient:
        async def is_model_ready(self, model: str, client_timeout: float) -> bool:
            raise InferenceServerException("Deadline Exceeded", "StatusCode.DEADLINE_EXCEEDED")

    triton = Triton()
    triton._clients["127.0.0.1:1"] = SlowClient()  # type: ignore[assignment]
    with pytest.raises(ReadinessUnknown):
        await triton.why_not_ready("127.0.0.1:1", "m")
