"""Fuzzing the running edge with schemathesis, from its own /openapi.json, over HTTP.

Every operation gets generated requests, valid and invalid ones (bounded per operation, reproducible).
Two in three generated requests name a real model, so that valid ones reach the services and Triton instead
of stopping at a 404. The checks: no 5xx; status, content type and body as /openapi.json declares them;
every 4xx is exactly OpenAI's error body; streams end with [DONE] and carry no error event; every 2xx
matches OpenAI's published schema for that endpoint (or our documented shape for rerank, which OpenAI does
not have).
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import hypothesis
import jsonschema
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from launcher.stack import LocalStack
from tests.support.anthropic_schema import validate_count, validate_error, validate_event, validate_message
from tests.support.openai_schema import validate
from tests.support.streams import parse_events, validate_completion_chunk

# The model each operation's valid requests use: the fast deterministic echo model for generation (never
# the real LLM: a fuzzer would make it generate for minutes).
REAL_MODELS = {
    "/v1/chat/completions": "ft-echo",
    "/v1/completions": "ft-echo",
    "/v1/embeddings": "all-minilm-l6-v2",
    "/v1/rerank": "minilm-rerank",
    "/v2/rerank": "minilm-rerank",
    "/rerank": "minilm-rerank",
    "/v1/ranking": "minilm-rerank",
    "/embed": "all-minilm-l6-v2",
    "/v1/messages": "ft-echo",
    "/v1/messages/count_tokens": "ft-echo",
    "/v1/responses": "ft-echo",
    "/v1/chat/interactive": "ft-echo",
    "/tokenize": "ft-echo",
    "/detokenize": "ft-echo",
}
# Chat and completions go to the echo model of each Triton LLM interface in turn, so that what each backend
# refuses (a model's refusal is a 400 with its reason, told by its words inside a stream) is fuzzed too.
BACKEND_MODELS = {path: ("ft-echo", "trtllm-echo", "vllm-echo") for path in ("/v1/chat/completions",
                                                                             "/v1/completions")}
# Each generation endpoint's cap on the tokens to generate.
TOKEN_CAPS = {"/v1/chat/completions": ("max_tokens", "max_completion_tokens"), "/v1/completions": ("max_tokens",),
              "/v1/responses": ("max_output_tokens",), "/v1/chat/interactive": ("request_output_len",),
              "/v1/messages": ("max_tokens",)}
MAX_GENERATED_TOKENS = 8
ERROR_KEYS = {"message", "type", "param", "code"}

# Every operation the edge documents; a new one must be added here (the first test checks).
OPERATIONS = [("GET", "/v1/models"), ("GET", "/v1/models/{model_id}"), ("POST", "/v1/chat/completions"),
              ("POST", "/v1/completions"), ("POST", "/v1/embeddings"), ("POST", "/v1/rerank"),
              ("POST", "/v2/rerank"), ("POST", "/rerank"), ("GET", "/health"), ("GET", "/health/ready"),
              ("GET", "/v1/health/ready"), ("GET", "/health/live"), ("GET", "/v1/health/live"),
              ("POST", "/v1/responses"), ("GET", "/v1/responses/{response_id}"), ("POST", "/v1/chat/interactive"),
              ("POST", "/tokenize"), ("POST", "/detokenize"), ("POST", "/v1/ranking"), ("GET", "/info"),
              ("POST", "/embed"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens"),
              ("POST", "/v1/files"), ("GET", "/v1/files"), ("GET", "/v1/files/{file_id}"),
              ("GET", "/v1/files/{file_id}/content"), ("DELETE", "/v1/files/{file_id}"), ("POST", "/v1/batches"),
              ("GET", "/v1/batches"), ("GET", "/v1/batches/{batch_id}"), ("POST", "/v1/batches/{batch_id}/cancel")]
# The Batch API's lists and objects, by OpenAI's schema (an empty list has no first and last id).
BATCH_SCHEMAS = {("POST", "/v1/files"): "OpenAIFile", ("GET", "/v1/files"): "ListFilesResponse",
                 ("GET", "/v1/files/{file_id}"): "OpenAIFile", ("DELETE", "/v1/files/{file_id}"): "DeleteFileResponse",
                 ("POST", "/v1/batches"): "Batch", ("GET", "/v1/batches"): "ListBatchesResponse",
                 ("GET", "/v1/batches/{batch_id}"): "Batch", ("POST", "/v1/batches/{batch_id}/cancel"): "Batch"}
EMPTY_LIST = {"object": "list", "data": [], "first_id": None, "last_id": None, "has_more": False}
# Hugging Face TEI's routes answer TEI's error body; /rerank and /tokenize do for a TEI body (`texts`, `inputs`).
TEI_PATHS = {"/info", "/embed"}
ERROR_SCHEMAS = ({"$ref": "#/components/schemas/ErrorResponse"}, {"$ref": "#/components/schemas/TEIErrorResponse"})
ANTHROPIC_ERROR_SCHEMA = {"$ref": "#/components/schemas/AnthropicError"}  # Anthropic's routes, /v1/messages...
MAX_EXAMPLES = 40  # per operation, valid and invalid requests together


@pytest.fixture(scope="module")
def edge_schema(stack: LocalStack) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(f"{stack.edge_url}/openapi.json")


def _utf8(value: Any) -> Any:
    """`value` with every string valid UTF-8 (lone surrogates, which the edge refuses to parse, become ?)."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    if isinstance(value, list):
        return [_utf8(item) for item in value]
    if isinstance(value, dict):
        return {_utf8(key): _utf8(item) for key, item in value.items()}
    return value


def _with_real_model(case: schemathesis.Case, backend: int) -> None:
    """The generated request for a model that exists (the `backend`th of BACKEND_MODELS where the path has
    several), in valid UTF-8, so that it gets past the parser and the model lookup."""
    if case.operation.path == "/v1/models/{model_id}":
        case.path_parameters = {"model_id": REAL_MODELS["/v1/embeddings"]}
    models = BACKEND_MODELS.get(case.operation.path)
    model = models[backend % len(models)] if models else REAL_MODELS.get(case.operation.path)
    if model is not None and isinstance(case.body, dict):
        case.body = {**_utf8(case.body), "model": model}


def _few_tokens(case: schemathesis.Case) -> None:
    """Generation asks for a few tokens at most, whatever the model (a request without one goes to the
    default LLM, the real SmolLM2 on this CPU); larger counts that do not fit the wire stay: the edge must
    refuse them."""
    caps = TOKEN_CAPS.get(case.operation.path, ())
    if not caps or not isinstance(case.body, dict):
        return
    body = dict(case.body)
    for key in caps:
        value = body.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or MAX_GENERATED_TOKENS < value < 2**32:
            body[key] = MAX_GENERATED_TOKENS
    case.body = body


def _error_body(payload: Any) -> str | None:
    """Why `payload` is not exactly {"error": {"message": str, "type": str, "param": str|null, "code":
    str|null}}, or None when it is."""
    if not isinstance(payload, dict) or set(payload) != {"error"}:
        return f"not an OpenAI error body: {payload!r}"[:500]
    error = payload["error"]
    if not isinstance(error, dict) or set(error) != ERROR_KEYS:
        return f"error object keys are not {sorted(ERROR_KEYS)}: {error!r}"[:500]
    if not isinstance(error["message"], str) or not error["message"]:
        return f"error.message must be a non-empty string: {error!r}"[:500]
    if not isinstance(error["type"], str):
        return f"error.type must be a string: {error!r}"[:500]
    for key in ("param", "code"):
        if error[key] is not None and not isinstance(error[key], str):
            return f"error.{key} must be a string or null: {error!r}"[:500]
    return None


def _tei_error_body(payload: Any) -> str | None:
    """Why `payload` is not exactly TEI's {"error": str, "error_type": str}, or None when it is."""
    if not isinstance(payload, dict) or set(payload) != {"error", "error_type"} or not payload["error"]:
        return f"not a TEI error body: {payload!r}"[:500]
    return None


def _is_tei(case: schemathesis.Case) -> bool:
    body = _body(case)
    return case.operation.path in TEI_PATHS or (case.operation.path == "/rerank" and "texts" in body
                                                and "documents" not in body) or (
        case.operation.path == "/tokenize" and "inputs" in body)


def openai_error_shape(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                       case: schemathesis.Case) -> bool | None:
    """Every 4xx and 5xx response has OpenAI's error body (TEI's on TEI's routes, Anthropic's on its), as JSON."""
    if response.status_code < 400:
        return None
    if case.operation.path.startswith("/v1/messages"):
        assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
        validate_error(json.loads(response.content))
        return True
    if _is_tei(case):
        assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
        problem = _tei_error_body(json.loads(response.content))
        assert problem is None, f"{response.status_code}: {problem}"
        return True
    assert response.headers.get("content-type", [""])[0].startswith("application/json"), response.headers
    problem = _error_body(json.loads(response.content))
    assert problem is None, f"{response.status_code}: {problem}"
    return True


def _stream_chunks(response: schemathesis.Response) -> list[dict[str, Any]]:
    events = parse_events(response.content.decode())
    assert events and events[-1].data == "[DONE]", "the stream does not end with [DONE]"
    assert [e.data for e in events].count("[DONE]") == 1
    for event in events:
        if event.name == "error":
            problem = _error_body(json.loads(event.data))
            raise AssertionError(f"the stream failed: {problem or event.data}")
    assert all(e.name is None for e in events)
    return [json.loads(e.data) for e in events[:-1]]


def _body(case: schemathesis.Case) -> dict[str, Any]:
    return case.body if isinstance(case.body, dict) else {}


def _rerank_results(results: Any, body: dict[str, Any]) -> None:
    documents = body.get("documents") or body.get("texts") or []
    top_n = body.get("top_n")
    expected = len(documents) if not top_n else min(int(top_n), len(documents))
    assert isinstance(results, list) and len(results) == expected, (len(results), expected)
    indexes = [r["index"] for r in results]
    assert len(set(indexes)) == len(indexes) and all(0 <= i < len(documents) for i in indexes)


def openai_success_shape(ctx: schemathesis.CheckContext, response: schemathesis.Response,
                         case: schemathesis.Case) -> bool | None:
    """Every 2xx matches what the endpoint promises; streams end normally with [DONE]."""
    if not 200 <= response.status_code < 300:
        return None
    path, body = case.operation.path, _body(case)
    content_type = response.headers.get("content-type", [""])[0]
    if content_type.startswith("application/x-ndjson"):
        assert path == "/v1/chat/interactive" and body.get("stream") is True
        lines = [json.loads(line) for line in response.content.split(b"\n") if line]
        assert lines and lines[-1]["finish_reason"] in ("stop", "length"), lines[-1:]
        return True
    if content_type.startswith("text/event-stream") and path == "/v1/responses":
        assert body.get("stream") is True
        events = parse_events(response.content.decode())
        assert events[-1].data == "[DONE]" and all(e.name != "error" for e in events), events[-2:]
        for event in events[:-1]:
            validate(json.loads(event.data), "ResponseStreamEvent")
        return True
    if content_type.startswith("text/event-stream") and path == "/v1/messages":
        assert body.get("stream") is True
        events = parse_events(response.content.decode())
        assert [e.name for e in events][-1] == "message_stop", events[-2:]
        for event in events:
            validate_event(json.loads(event.data))
        return True
    if content_type.startswith("text/event-stream"):
        assert path in ("/v1/chat/completions", "/v1/completions") and body.get("stream") is True
        chunks = _stream_chunks(response)
        assert chunks, "a stream without a single chunk"
        for chunk in chunks:
            if path == "/v1/chat/completions":
                validate(chunk, "CreateChatCompletionStreamResponse")
            else:
                validate_completion_chunk(chunk)
        return True
    if path == "/v1/files/{file_id}/content":  # a file's bytes, whatever they are
        return True
    assert content_type.startswith("application/json"), content_type
    payload = json.loads(response.content)
    if (case.method.upper(), path) in BATCH_SCHEMAS:
        if payload != EMPTY_LIST:
            validate(payload, BATCH_SCHEMAS[case.method.upper(), path])
    elif path == "/v1/models":
        validate(payload, "ListModelsResponse")
    elif path == "/v1/models/{model_id}":
        validate(payload, "Model")
    elif path == "/v1/chat/completions":
        validate(payload, "CreateChatCompletionResponse")
        assert len(payload["choices"]) == (body.get("n") or 1)
    elif path == "/v1/completions":
        validate(payload, "CreateCompletionResponse")
    elif path == "/v1/embeddings":
        if body.get("encoding_format") == "base64":
            assert all(isinstance(item["embedding"], str) for item in payload["data"])
        else:
            validate(payload, "CreateEmbeddingResponse")
        assert [item["index"] for item in payload["data"]] == list(range(len(payload["data"])))
    elif path in ("/v1/rerank", "/v2/rerank") or (path == "/rerank" and isinstance(payload, dict)):
        assert payload["data"] == payload["results"]
        _rerank_results(payload["results"], body)
    elif path == "/rerank":
        _rerank_results(payload, body)
    elif path == "/v1/ranking":
        _rerank_results(payload["rankings"], {"documents": body.get("passages")})
    elif path == "/info":
        assert payload["model_id"] and payload["max_client_batch_size"] >= 1
    elif path == "/embed":
        inputs = body.get("inputs")
        one = isinstance(inputs, str) or (isinstance(inputs, list) and bool(inputs) and isinstance(inputs[0], int))
        assert len(payload) == (1 if one else len(inputs or []))
    elif path in ("/health", "/health/ready", "/v1/health/ready", "/health/live", "/v1/health/live"):
        assert payload["status"] == "ok"
    elif path in ("/v1/responses", "/v1/responses/{response_id}"):
        validate(payload, "Response")
    elif path == "/v1/chat/interactive":
        assert isinstance(payload["text"], str) and payload["finish_reason"] in ("stop", "length")
    elif path == "/tokenize" and isinstance(payload, list):
        inputs = body.get("inputs")
        assert len(payload) == (1 if isinstance(inputs, str) else len(inputs or []))
    elif path == "/tokenize":
        assert payload["count"] == len(payload["tokens"])
    elif path == "/detokenize":
        assert isinstance(payload["prompt"], str)
    elif path == "/v1/messages":
        validate_message(payload)
    elif path == "/v1/messages/count_tokens":
        validate_count(payload)
    else:
        raise AssertionError(f"no expectation for {path}")
    return True


# Schemathesis' own (the status, content type and body match what /openapi.json declares), then ours.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          openai_error_shape, openai_success_shape]


def test_every_operation_is_fuzzed_and_declares_openai_errors(edge_schema: schemathesis.BaseSchema) -> None:
    operations = [result.ok() for result in edge_schema.get_all_operations()]
    assert {(op.method.upper(), op.path) for op in operations} == set(OPERATIONS)
    for operation in operations:
        responses = operation.definition.raw["responses"]
        assert "422" not in responses, operation.label  # FastAPI's {"detail": ...} is never sent
        for status in ("4XX", "5XX"):
            schema = responses[status]["content"]["application/json"]["schema"]
            if operation.path.startswith("/v1/messages"):
                assert schema == ANTHROPIC_ERROR_SCHEMA, operation.label
                continue
            assert schema in ERROR_SCHEMAS or schema.get("anyOf") == list(ERROR_SCHEMAS), operation.label


def _check(case: schemathesis.Case) -> None:
    response = case.call(timeout=60)
    try:
        case.validate_response(response, checks=CHECKS)
    except jsonschema.ValidationError as exc:  # from OpenAI's schemas: show the request too
        raise AssertionError(f"{case.operation.label} {case.body!r}: {exc.message}") from exc


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=[f"{m} {p}" for m, p in OPERATIONS])
def test_edge_conforms(edge_schema: schemathesis.BaseSchema, method: str, path: str) -> None:
    operation = edge_schema[path][method]
    cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

    @hypothesis.given(case=cases, real_model=st.sampled_from([True, True, False]), backend=st.integers(0, 2))
    @hypothesis.settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
                         suppress_health_check=list(hypothesis.HealthCheck))
    def fuzz(case: schemathesis.Case, real_model: bool, backend: int) -> None:
        if real_model:
            _with_real_model(case, backend)
        _few_tokens(case)
        _check(case)

    fuzz()


# What the fuzzer found, kept as fixed cases: each was a 500 (a protobuf encoding error in the edge).
CHAT = {"model": "ft-echo", "messages": [{"role": "user", "content": "hi"}]}
REFUSED = [
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2**40}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 2**33}, "max_completion_tokens"),
    ("/v1/completions", {"model": "ft-echo", "prompt": "hi", "max_tokens": 2**32}, "max_tokens"),
    ("/v1/completions", {"model": "ft-echo", "prompt": "hi", "max_tokens": 3, "top_k": 2**40}, "top_k"),
    ("/v1/embeddings", {"model": "all-minilm-l6-v2", "input": "x", "dimensions": 2**40}, "dimensions"),
]


@pytest.mark.parametrize(("path", "body", "param"), REFUSED, ids=[param for _, _, param in REFUSED])
def test_counts_beyond_uint32_are_refused(http: httpx.Client, path: str, body: dict[str, Any], param: str) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert _error_body(response.json()) is None
    assert response.json()["error"]["param"] == param


@pytest.mark.parametrize("raw", [
    b'{"model": "minilm-rerank", "query": "\\udb03", "documents": ["a"]}',  # a lone UTF-16 surrogate
    b'{"model": "minilm-rerank", "query": "q", "documents": ["a\\ud800b"]}',
    b'{"model": "minilm-rerank", "query": "q", "documents": ["a"], "top_n": NaN}',
])
def test_what_utf8_or_json_cannot_carry_is_a_parse_error(http: httpx.Client, raw: bytes) -> None:
    response = http.post("/v1/rerank", content=raw, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, response.text
    assert _error_body(response.json()) is None
    assert "could not parse the JSON body" in response.json()["error"]["message"]


def test_a_huge_top_n_returns_every_document(http: httpx.Client) -> None:
    body = {"model": "minilm-rerank", "query": "capital of France", "documents": ["Paris", "a cat"], "top_n": 2**40}
    response = http.post("/v1/rerank", json=body)
    assert response.status_code == 200, response.text
    assert sorted(r["index"] for r in response.json()["results"]) == [0, 1]


def test_the_error_shape_check_refuses_other_bodies() -> None:
    assert _error_body({"error": {"message": "m", "type": "t", "param": None, "code": None}}) is None
    assert _error_body({"detail": [{"loc": ["body"], "msg": "field required"}]})  # FastAPI's default
    assert _error_body({"error": {"message": "m", "type": "t", "param": None}})
    assert _error_body({"error": {"message": "m", "type": "t", "param": 3, "code": None}})
    assert _error_body({"error": {"message": "", "type": "t", "param": None, "code": None}})
    assert _error_body({"error": "m"})


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/interactive", {"model": "ft-echo", "prompt": "hi", "request_output_len": 2,
                              "repetition_penalty": 5e-324}),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 2, "repetition_penalty": 1e-40}),
])
def test_a_penalty_that_float32_makes_zero_is_refused(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    """Found by the fuzzer: a positive penalty too small for the float32 on the wire arrived as 0."""
    response = http.post(path, json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "repetition_penalty"
