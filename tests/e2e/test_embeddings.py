"""/v1/embeddings end to end: openai SDK → edge → embed service → real Triton → MiniLM."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from tests.support.openai_schema import validate
from tests.support.stack import BODY_LIMIT

MODEL = "all-minilm-l6-v2"
HIDDEN = "all-minilm-l6-v2-hidden"  # same Triton model, hidden states pooled in the service, 4 rows per call
STRICT = "all-minilm-l6-v2-strict"  # max_tokens 16 with truncation off


def vectors(response: openai.types.CreateEmbeddingResponse) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def reference(models_dir: Path, texts: list[str], max_tokens: int = 256) -> np.ndarray:
    """What the model computes in this process with transformers: mean pooling, then L2 norm."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    path = models_dir / MODEL
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_tokens, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).float()
    pooled = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(pooled, dim=1).numpy()


def test_sdk_default_base64_matches_transformers_in_process(client: openai.OpenAI, models_dir: Path) -> None:
    texts = ["The food was delicious and the waiter was friendly.", "Paris is the capital of France."]
    response = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64
    got = vectors(response)
    assert got.shape == (2, 384)
    np.testing.assert_allclose(got, reference(models_dir, texts), atol=1e-5)
    assert response.usage.prompt_tokens == response.usage.total_tokens > 10
    assert response.model == MODEL


# Two requests may reach the model in different batches (Triton's dynamic batcher, the services' merging):
# MiniLM's numbers then differ in the last bits (padding, kernel choice), by up to 2e-7 as measured.
ACROSS_REQUESTS = 1e-6


def test_float_and_base64_carry_the_same_vectors(http: httpx.Client) -> None:
    body = {"model": MODEL, "input": ["one", "two words"]}
    floats = http.post("/v1/embeddings", json={**body, "encoding_format": "float"}).json()
    encoded = http.post("/v1/embeddings", json={**body, "encoding_format": "base64"}).json()
    validate(floats, "CreateEmbeddingResponse")  # OpenAI's schema types `embedding` as the float array
    for f, b in zip(floats["data"], encoded["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_allclose(decoded, np.array(f["embedding"], dtype=np.float32), rtol=0, atol=ACROSS_REQUESTS)
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert floats["usage"] == {"prompt_tokens": 7, "total_tokens": 7}  # [CLS] one [SEP] [CLS] two words [SEP]


def test_paraphrases_are_closer_than_unrelated_sentences(client: openai.OpenAI) -> None:
    a, b, c = vectors(client.embeddings.create(model=MODEL, input=[
        "How do I reset my password?",
        "I forgot my password and need to change it.",
        "The recipe calls for two cups of flour.",
    ], encoding_format="float"))
    assert float(a @ b) > float(a @ c) + 0.3


def test_service_side_pooling_and_batch_splitting_match_the_pooled_output(client: openai.OpenAI) -> None:
    texts = [f"sentence number {i} " + "word " * (i % 5) for i in range(10)]  # 3 Triton calls of ≤ 4 rows
    pooled_in_model = vectors(client.embeddings.create(model=MODEL, input=texts))
    pooled_in_service = vectors(client.embeddings.create(model=HIDDEN, input=texts))
    np.testing.assert_allclose(pooled_in_service, pooled_in_model, atol=1e-5)


def test_token_id_inputs(client: openai.OpenAI, models_dir: Path) -> None:
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(models_dir / MODEL)("hello world")["input_ids"]
    from_text = vectors(client.embeddings.create(model=MODEL, input="hello world"))
    from_ids = vectors(client.embeddings.create(model=MODEL, input=ids))
    from_id_lists = vectors(client.embeddings.create(model=MODEL, input=[ids, ids]))
    np.testing.assert_allclose(from_ids, from_text, atol=ACROSS_REQUESTS)
    np.testing.assert_allclose(from_id_lists, np.vstack([from_text, from_text]), atol=ACROSS_REQUESTS)


def test_dimensions_truncate_and_renormalise(client: openai.OpenAI) -> None:
    full = vectors(client.embeddings.create(model=MODEL, input="matryoshka"))[0]
    short = vectors(client.embeddings.create(model=MODEL, input="matryoshka", dimensions=64))[0]
    assert short.shape == (64,)
    np.testing.assert_allclose(short, full[:64] / np.linalg.norm(full[:64]), atol=ACROSS_REQUESTS)


def test_long_inputs_are_truncated_at_max_tokens(client: openai.OpenAI, models_dir: Path) -> None:
    text = "a long sentence that goes on " * 20
    response = client.embeddings.create(model=HIDDEN, input=text)
    assert response.usage.prompt_tokens == 16
    np.testing.assert_allclose(vectors(response), reference(models_dir, [text], max_tokens=16), atol=1e-5)


def test_the_largest_allowed_request(client: openai.OpenAI) -> None:
    texts = [f"input {i}" for i in range(2048)]
    response = client.embeddings.create(model=MODEL, input=texts)
    assert [item.index for item in response.data] == list(range(2048))
    single = vectors(client.embeddings.create(model=MODEL, input=texts[1234]))
    np.testing.assert_allclose(vectors(response)[1234], single[0], atol=1e-5)


def test_models_list_and_retrieve(http: httpx.Client, client: openai.OpenAI) -> None:
    listing = http.get("/v1/models").json()
    validate(listing, "ListModelsResponse")
    entry = next(m for m in listing["data"] if m["id"] == MODEL)
    assert entry["max_model_len"] == 256 and entry["root"] == MODEL and entry["parent"] is None
    assert entry["permission"][0]["object"] == "model_permission"
    assert client.models.retrieve(MODEL).id == MODEL
    missing = http.get("/v1/models/no-such-model")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_health(http: httpx.Client) -> None:
    body = http.get("/health").json()
    assert body["status"] == "ok" and body["services"]["embed"] == "serving"
    for path in ("/health/ready", "/v1/health/ready"):
        assert http.get(path).json() == body
    for path in ("/health/live", "/v1/health/live"):
        assert http.get(path).json() == {"status": "ok"}


def test_swagger_ui(http: httpx.Client) -> None:
    assert "swagger-ui" in http.get("/docs").text
    assert "/v1/embeddings" in http.get("/openapi.json").json()["paths"]


BAD_REQUESTS = [
    ("malformed json", b'{"model": "all-minilm-l6-v2", "input": ', 400, None),
    ("missing input", {"model": MODEL}, 400, "input"),
    ("model not a string", {"model": 5, "input": "x"}, 400, "model"),  # without one: the default (TEI clients')
    ("empty string", {"model": MODEL, "input": ""}, 400, "input"),
    ("empty list", {"model": MODEL, "input": []}, 400, "input"),
    ("empty token list", {"model": MODEL, "input": [[]]}, 400, "input"),
    ("number", {"model": MODEL, "input": 5}, 400, "input"),
    ("mixed list", {"model": MODEL, "input": ["a", 1]}, 400, "input"),
    ("object", {"model": MODEL, "input": {"text": "a"}}, 400, "input"),
    ("negative token", {"model": MODEL, "input": [-1, 5]}, 400, "input"),
    ("token outside vocabulary", {"model": MODEL, "input": [[101, 30522]]}, 400, "input"),
    ("model not a string", {"model": 7, "input": "x"}, 400, "model"),
    ("unknown encoding_format", {"model": MODEL, "input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
    ("dimensions 0", {"model": MODEL, "input": "x", "dimensions": 0}, 400, "dimensions"),
    ("dimensions too large", {"model": MODEL, "input": "x", "dimensions": 385}, 400, "dimensions"),
    ("too many inputs", {"model": MODEL, "input": ["x"] * 2049}, 400, "input"),
    ("too long without truncation", {"model": STRICT, "input": "word " * 40}, 400, "input"),
    ("unknown model", {"model": "no-such-model", "input": "x"}, 404, "model"),
    ("body not an object", [1, 2], 400, None),
]


@pytest.mark.parametrize(("case", "body", "status", "param"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
def test_bad_requests_get_openai_errors(http: httpx.Client, case: str, body: object, status: int,
                                        param: str | None) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = http.post("/v1/embeddings", content=content, headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    validate(error, "ErrorResponse")
    assert set(error["error"]) == {"message", "type", "param", "code"}
    assert error["error"]["param"] == param
    assert "detail" not in error and "Traceback" not in response.text
    if status == 404:
        assert error["error"]["code"] == "model_not_found"
    # The next valid request is served.
    assert http.post("/v1/embeddings", json={"model": MODEL, "input": "still fine"}).status_code == 200


def test_model_of_another_kind_is_a_400(http: httpx.Client) -> None:
    kinds = {m["id"] for m in http.get("/v1/models").json()["data"]}
    other = next(iter(kinds - {MODEL, HIDDEN, STRICT}))
    response = http.post("/v1/embeddings", json={"model": other, "input": "x"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "model"


def test_body_over_the_limit_is_413(http: httpx.Client) -> None:
    body = json.dumps({"model": MODEL, "input": ["x" * 1000] * (BODY_LIMIT // 1000 + 10)}).encode()
    response = http.post("/v1/embeddings", content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    validate(response.json(), "ErrorResponse")

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(BODY_LIMIT // 65536 + 2):
            yield b" " * 65536

    chunked = http.post("/v1/embeddings", content=chunks(), headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    assert http.post("/v1/embeddings", json={"model": MODEL, "input": "after"}).status_code == 200


def test_tiktoken_ids_get_a_message_that_says_how_to_fix_langchain(http: httpx.Client) -> None:
    """LangChain's OpenAIEmbeddings sends cl100k token ids by default; 100257 is cl100k's <|endoftext|>."""
    response = http.post("/v1/embeddings", json={"model": MODEL, "input": [[9906, 1917, 100257]]})
    assert response.status_code == 400 and response.json()["error"]["param"] == "input"
    message = response.json()["error"]["message"]
    assert "check_embedding_ctx_length=False" in message and "tiktoken_enabled=False" in message
