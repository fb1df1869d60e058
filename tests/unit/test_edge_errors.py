"""The one table from service gRPC codes to HTTP errors in OpenAI's shape."""

from __future__ import annotations

import grpc
import httpx
import pytest
from fastapi import FastAPI

from edge.errors import GRPC_TO_HTTP, OpenAIError, from_grpc, install_error_handlers
from edge.telemetry import install_metrics


class FakeRpcError(grpc.aio.AioRpcError):
    def __init__(self, code: grpc.StatusCode, details: str, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        super().__init__(code, grpc.aio.Metadata(), grpc.aio.Metadata(*metadata), details)


@pytest.mark.parametrize(("code", "status"), [
    (grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.NOT_FOUND, 404),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429), (grpc.StatusCode.UNAVAILABLE, 503),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 504), (grpc.StatusCode.INTERNAL, 500), (grpc.StatusCode.UNKNOWN, 500),
])
def test_status_codes(code: grpc.StatusCode, status: int) -> None:
    assert from_grpc(FakeRpcError(code, "x"), "embed").status == status


def test_param_and_code_travel_in_trailing_metadata() -> None:
    error = from_grpc(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "input[3] is empty",
                                   (("tg-param", "input"), ("tg-code", "empty_input"))), "embed")
    assert error.body() == {"error": {"message": "input[3] is empty", "type": "invalid_request_error",
                                      "param": "input", "code": "empty_input"}}


def test_internal_details_stay_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    error = from_grpc(FakeRpcError(grpc.StatusCode.INTERNAL, "Traceback: secret path /etc/x"), "llm")
    assert "secret" not in error.message and error.type == "server_error"
    assert "secret path" in caplog.text


def test_unavailable_without_service_detail_says_which_service() -> None:
    error = from_grpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"), "rerank")
    assert error.status == 503 and "rerank service is unavailable" in error.message
    assert error.code == "service_unavailable"


def test_every_mapped_status_has_an_openai_type() -> None:
    for status, type_, _ in GRPC_TO_HTTP.values():
        assert OpenAIError(status, "m", type_=type_).body()["error"]["type"] == type_


def test_an_overloaded_service_is_a_429_that_says_when_to_retry() -> None:
    error = from_grpc(FakeRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "at its limit of 4 concurrent requests",
                                   (("tg-code", "overloaded"),)), "llm", retry_after_s=3)
    response = error.response()
    assert response.status_code == 429 and response.headers["retry-after"] == "3"
    assert error.body()["error"] == {"message": "at its limit of 4 concurrent requests", "type": "rate_limit_error",
                                     "param": None, "code": "overloaded"}
    assert "retry-after" not in from_grpc(FakeRpcError(grpc.StatusCode.INTERNAL, "x"), "llm").response().headers


def test_an_unavailable_model_is_a_503_that_says_when_to_retry() -> None:
    error = from_grpc(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Triton model `m` is unavailable: Stub process "
                                   "'m_0_0' is not healthy.", (("tg-code", "service_unavailable"),)), "embed", 2)
    assert error.status == 503 and error.response().headers["retry-after"] == "2"


async def test_an_unexpected_failure_is_a_500_that_tells_nothing_but_carries_the_request_id(
        caplog: pytest.LogCaptureFixture) -> None:
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    install_metrics(app)  # the per-request middleware that sets the request id, as in the edge
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://edge") as client:
        response = await client.get("/boom", headers={"X-Request-ID": "req-500"})
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "req-500"
    assert response.json() == {"error": {"message": "The server had an error while processing your request.",
                                         "type": "server_error", "param": None, "code": None}}
    assert "secret internals" in caplog.text and "secret internals" not in response.text
