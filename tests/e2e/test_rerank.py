"""Rerank end to end through the real Triton reranker: Denglin openai_api's API, Cohere/Jina and TEI shapes."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from tests.support.openai_schema import validate

MODEL = "minilm-rerank"
RAW = "minilm-rerank-raw"  # the same Triton model, raw logits, max_tokens 64

# The example of Denglin's openai_api manual (§4.5), with the demo model's name.
SEED_QUERY = "What principles does the management of finished oil circulation in Jiangsu Province follow?"
SEED_DOCUMENTS = [
    "Article 1 In order to strengthen the management of finished oil circulation, standardize finished oil "
    "business operations, maintain market order for finished oil, protect the legitimate rights and interests "
    "of finished oil operators and consumers, according to relevant laws, regulations, and State Council "
    "decisions, combined with the actual conditions of this province, this law is formulated.",
    "Article 12 The market supervision and administration department shall push the information of enterprises "
    "with new registered business scopes involving finished oil wholesale and storage through the government "
    "shared platform to the commerce department. The commerce department shall promptly push information found "
    "during industry regulation that is not within its regulatory responsibilities to the competent "
    "authorities concerned.",
    "Article 3 The management of finished oil circulation follows the principles of legal management, ensuring "
    "supply, safe development, and fair competition.",
    "Article 7 The finished oil industry association shall establish and improve industry operating "
    "self-discipline norms, self-regulation conventions, and professional ethics standards, regulate member "
    "behavior, and play a role in rights protection, dispute resolution, and industry self-regulation.",
]


def seed_request(**overrides: object) -> dict[str, object]:
    return {"query": SEED_QUERY, "documents": SEED_DOCUMENTS, "model": MODEL, "encoding_format": "float",
            "return_documents": True, "top_n": 3, **overrides}


def test_the_seed_example_ranks_article_3_first_in_the_seed_shape(http: httpx.Client) -> None:
    response = http.post("/v1/rerank", json=seed_request())
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list" and body["model"] == MODEL
    assert next(r["index"] for r in body["data"]) == 2
    assert len(body["data"]) == 3
    for entry in body["data"]:
        assert set(entry) == {"object", "index", "relevance_score", "document"}
        assert entry["object"] == "rerank"
        assert entry["document"] == {"text": SEED_DOCUMENTS[entry["index"]]}
        assert 0 < entry["relevance_score"] < 1
    scores = [e["relevance_score"] for e in body["data"]]
    assert scores == sorted(scores, reverse=True)
    assert body["results"] == body["data"]  # Cohere/Jina clients read `results`
    usage = body["usage"]
    assert usage["completion_tokens"] == 0 and usage["total_tokens"] == usage["prompt_tokens"] > 100


def test_documents_are_left_out_unless_asked_for(http: httpx.Client) -> None:
    body = http.post("/v1/rerank", json=seed_request(return_documents=False, top_n=None)).json()
    assert len(body["data"]) == 4
    assert all("document" not in entry for entry in body["data"])
    default = http.post("/v1/rerank", json={"model": MODEL, "query": "q", "documents": ["a", "b"]}).json()
    assert all("document" not in entry for entry in default["data"])


def test_top_n_as_a_numeric_string(http: httpx.Client) -> None:
    body = http.post("/v1/rerank", json=seed_request(top_n="2")).json()
    assert len(body["data"]) == 2 and body["data"][0]["index"] == 2


def test_cohere_v2_shape(http: httpx.Client) -> None:
    response = http.post("/v2/rerank", json={"model": MODEL, "query": SEED_QUERY, "top_n": 2,
                                             "documents": [{"text": d} for d in SEED_DOCUMENTS]})
    body = response.json()
    assert next(r["index"] for r in body["results"]) == 2 and len(body["results"]) == 2
    assert isinstance(body["id"], str) and body["id"]


def test_jina_and_ragflow_shapes(http: httpx.Client) -> None:
    jina = http.post("/v1/rerank", json={"model": MODEL, "query": SEED_QUERY, "documents": SEED_DOCUMENTS,
                                         "top_n": 4, "return_documents": True}).json()
    assert jina["results"][0]["document"]["text"].startswith("Article 3")
    ragflow = http.post("/rerank", json={"model": MODEL, "query": SEED_QUERY, "documents": SEED_DOCUMENTS,
                                         "top_n": 4}).json()
    assert [r["index"] for r in ragflow["results"]] == [r["index"] for r in jina["results"]]


def test_tei_shape(http: httpx.Client) -> None:
    plain = http.post("/rerank", json={"query": SEED_QUERY, "texts": SEED_DOCUMENTS, "model": MODEL}).json()
    assert isinstance(plain, list) and plain[0]["index"] == 2
    assert set(plain[0]) == {"index", "score"}
    raw = http.post("/rerank", json={"query": SEED_QUERY, "texts": SEED_DOCUMENTS, "model": MODEL,
                                     "raw_scores": True, "return_text": True}).json()
    assert raw[0]["text"] == SEED_DOCUMENTS[2]
    by_index = {r["index"]: r["score"] for r in raw}
    for entry in plain:
        assert entry["score"] == pytest.approx(1 / (1 + np.exp(-by_index[entry["index"]])), abs=1e-6)


def test_tei_truncate_false_rejects_overlong_texts(http: httpx.Client) -> None:
    response = http.post("/rerank", json={"query": "q", "texts": ["word " * 300], "model": MODEL, "truncate": False})
    assert response.status_code == 400 and response.json()["error_type"] == "Validation"  # TEI's error body
    assert "tokens" in response.json()["error"]


def test_normalized_scores_are_the_sigmoid_of_the_raw_logits(http: httpx.Client) -> None:
    documents = ["short text about oil", "Article 3 principles of management", "cats and dogs"]
    body = {"query": "oil management", "documents": documents}
    normalized = http.post("/v1/rerank", json={"model": MODEL, **body}).json()
    raw = http.post("/v1/rerank", json={"model": RAW, **body}).json()
    logits = {r["index"]: r["relevance_score"] for r in raw["data"]}
    for entry in normalized["data"]:
        assert 0 < entry["relevance_score"] < 1
        assert entry["relevance_score"] == pytest.approx(1 / (1 + np.exp(-logits[entry["index"]])), abs=1e-6)


def test_documents_longer_than_max_tokens_are_truncated(http: httpx.Client) -> None:
    long_document = "finished oil circulation management " * 100
    body = http.post("/v1/rerank", json={"model": RAW, "query": "oil", "documents": [long_document, "oil"]}).json()
    assert len(body["data"]) == 2
    assert body["usage"]["prompt_tokens"] <= 64 + 5  # one pair cut at 64 tokens, one short pair


def test_500_documents_in_one_request(http: httpx.Client) -> None:
    words = ["oil", "supply", "market", "river", "bakery", "laptop", "policy", "province", "article", "fair"]
    documents = [" ".join(words[(i * 7 + k) % 10] for k in range(60)) + f" number {i}" for i in range(500)]
    body = http.post("/v1/rerank", json={"model": MODEL, "query": "oil market policy", "documents": documents}).json()
    results = body["data"]
    assert sorted(r["index"] for r in results) == list(range(500))
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    by_index = {r["index"]: r["relevance_score"] for r in results}
    for i in (0, 137, 499):  # each document's score does not depend on its batch neighbours
        alone = http.post("/v1/rerank", json={"model": MODEL, "query": "oil market policy",
                                              "documents": [documents[i]]}).json()
        assert alone["data"][0]["relevance_score"] == pytest.approx(by_index[i], abs=1e-5)


def test_the_rerank_model_is_listed(http: httpx.Client) -> None:
    listing = http.get("/v1/models").json()
    validate(listing, "ListModelsResponse")
    assert MODEL in {m["id"] for m in listing["data"]}


BAD_REQUESTS = [
    ("missing query", {"model": MODEL, "documents": ["a"]}, 400, "query"),
    ("empty query", {"model": MODEL, "query": "", "documents": ["a"]}, 400, "query"),
    ("missing documents", {"model": MODEL, "query": "q"}, 400, "documents"),
    ("empty documents", {"model": MODEL, "query": "q", "documents": []}, 400, "documents"),
    ("too many documents", {"model": MODEL, "query": "q", "documents": ["d"] * 1001}, 400, "documents"),
    ("top_n zero", {"model": MODEL, "query": "q", "documents": ["a"], "top_n": 0}, 400, "top_n"),
    ("top_n not a number", {"model": MODEL, "query": "q", "documents": ["a"], "top_n": "many"}, 400, "top_n"),
    ("document a number", {"model": MODEL, "query": "q", "documents": ["a", 5]}, 400, "documents"),
    ("document object without text", {"model": MODEL, "query": "q", "documents": [{"title": "a"}]}, 400, "documents"),
    ("query too long for the model", {"model": RAW, "query": "word " * 80, "documents": ["a"]}, 400, "query"),
    ("unknown model", {"model": "no-such-model", "query": "q", "documents": ["a"]}, 404, "model"),
    ("an embedding model", {"model": "all-minilm-l6-v2", "query": "q", "documents": ["a"]}, 400, "model"),
]


@pytest.mark.parametrize(("case", "body", "status", "param"), BAD_REQUESTS, ids=[c[0] for c in BAD_REQUESTS])
@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank"])
def test_bad_requests_get_openai_errors(http: httpx.Client, path: str, case: str, body: dict[str, object],
                                        status: int, param: str) -> None:
    response = http.post(path, content=json.dumps(body), headers={"Content-Type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()
    validate(error, "ErrorResponse")
    assert error["error"]["param"] == param
    assert http.post(path, json={"model": MODEL, "query": "q", "documents": ["ok"]}).status_code == 200
