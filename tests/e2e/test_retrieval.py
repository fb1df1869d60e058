"""Retrieval APIs end to end through the real stack and MiniLM on Triton: NVIDIA NIM's (/v1/ranking, and
`input_type` / `truncate` on /v1/embeddings) through LangChain's NVIDIA package, and Hugging Face TEI's own
routes (/info, /embed, /tokenize, /rerank) as Dify's TEI provider calls them."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_nvidia_ai_endpoints import NVIDIAEmbeddings, NVIDIARerank

from launcher.stack import LocalStack

EMBED = "all-minilm-l6-v2"  # the stack's default embedding model (the first listed)
E5 = "all-minilm-l6-v2-e5"  # the same Triton model, max_tokens 16, prompts query / passage / topic
HIDDEN = "all-minilm-l6-v2-hidden"  # mean-pooled in the service, not normalised by the model
RERANK = "minilm-rerank"
CLOSE = 1e-5  # the same input in two requests may be batched with different neighbours

QUERY = "What principles does the management of finished oil circulation follow?"
PASSAGES = [
    "Article 7 The industry association shall establish self-discipline norms for its members.",
    "Article 3 The management of finished oil circulation follows the principles of legal management.",
    "The recipe calls for two cups of flour.",
]
LONG = "the quick brown fox jumps over the lazy dog " * 6  # far over E5's 16 tokens


def embedded(http: httpx.Client, model: str, texts: list[str] | list[list[int]]) -> np.ndarray:
    response = http.post("/v1/embeddings", json={"model": model, "input": texts, "encoding_format": "float"})
    assert response.status_code == 200, response.text
    return np.array([item["embedding"] for item in response.json()["data"]], dtype=np.float32)


def tei_error(response: httpx.Response, status: int, kind: str) -> str:
    """TEI's error body: {"error": message, "error_type": kind}."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == kind, body
    return str(body["error"])


def openai_error(response: httpx.Response, param: str) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    return str(error["message"])


# NVIDIA NIM


def test_nvidia_rerank_orders_passages_by_the_models_logits(stack: LocalStack, http: httpx.Client) -> None:
    ranker = NVIDIARerank(base_url=f"{stack.edge_url}/v1", model=RERANK, api_key="unused", top_n=3)
    ranked = ranker.compress_documents(query=QUERY, documents=[Document(page_content=p) for p in PASSAGES])
    logits = [d.metadata["relevance_score"] for d in ranked]
    assert ranked[0].page_content == PASSAGES[1]
    assert logits == sorted(logits, reverse=True) and len(ranked) == 3
    # The logits are the model's raw scores, as TEI's raw_scores gives them.
    raw = http.post("/rerank", json={"model": RERANK, "query": QUERY, "texts": PASSAGES, "raw_scores": True}).json()
    assert logits == pytest.approx([r["score"] for r in raw], abs=CLOSE)


def test_ranking_answers_rankings_and_usage(http: httpx.Client) -> None:
    body = {"model": RERANK, "query": {"text": QUERY}, "passages": [{"text": p} for p in PASSAGES],
            "truncate": "END"}
    answer = http.post("/v1/ranking", json=body).json()
    assert answer["rankings"][0]["index"] == 1 and len(answer["rankings"]) == 3
    assert set(answer["rankings"][0]) == {"index", "logit"}
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 20


def test_ranking_truncate_none_refuses_what_does_not_fit(http: httpx.Client) -> None:
    body = {"model": RERANK, "query": {"text": "q"}, "passages": [{"text": "word " * 300}], "truncate": "NONE"}
    assert "tokens" in openai_error(http.post("/v1/ranking", json=body), "documents")
    body["truncate"] = "END"
    assert http.post("/v1/ranking", json=body).status_code == 200


@pytest.mark.parametrize(("change", "param"), [
    ({"passages": []}, "passages"),
    ({"truncate": "START"}, "truncate"),  # NIM's ranking takes NONE or END
    ({"query": "not an object"}, "query"),
])
def test_bad_ranking_requests_name_the_parameter(http: httpx.Client, change: dict[str, object], param: str) -> None:
    body = {"model": RERANK, "query": {"text": QUERY}, "passages": [{"text": "a"}], **change}
    openai_error(http.post("/v1/ranking", json=body), param)


def test_nvidia_embeddings_put_the_models_query_and_passage_prompts_first(stack: LocalStack,
                                                                          http: httpx.Client) -> None:
    embedder = NVIDIAEmbeddings(base_url=f"{stack.edge_url}/v1", model=E5, api_key="unused")
    query = np.array(embedder.embed_query("oil circulation"), dtype=np.float32)
    passages = np.array(embedder.embed_documents(["oil circulation", "flour"]), dtype=np.float32)
    plain = embedded(http, E5, ["query: oil circulation", "passage: oil circulation", "passage: flour",
                                "oil circulation"])
    np.testing.assert_allclose(query, plain[0], atol=CLOSE)
    np.testing.assert_allclose(passages, plain[1:3], atol=CLOSE)
    assert float(query @ plain[3]) < 1 - 1e-3  # the prompt changed the vector


def test_input_type_is_ignored_by_a_model_without_prompts(http: httpx.Client) -> None:
    body = {"model": EMBED, "input": ["oil circulation"], "input_type": "query", "encoding_format": "float"}
    with_type = http.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    np.testing.assert_allclose(with_type, embedded(http, EMBED, ["oil circulation"])[0], atol=CLOSE)


def test_truncate_none_refuses_and_end_or_start_cut_on_their_side(stack: LocalStack, http: httpx.Client,
                                                                  models_dir: Path) -> None:
    from transformers import AutoTokenizer

    with pytest.raises(Exception, match="400"):
        NVIDIAEmbeddings(base_url=f"{stack.edge_url}/v1", model=E5, api_key="unused",
                         truncate="NONE").embed_query(LONG)
    tokenizer = AutoTokenizer.from_pretrained(models_dir / EMBED)
    for truncate, side in (("END", "right"), ("START", "left")):
        embedder = NVIDIAEmbeddings(base_url=f"{stack.edge_url}/v1", model=E5, api_key="unused", truncate=truncate)
        got = np.array(embedder.embed_query(LONG), dtype=np.float32)
        tokenizer.truncation_side = side
        ids = tokenizer("query: " + LONG, truncation=True, max_length=16)["input_ids"]
        np.testing.assert_allclose(got, embedded(http, E5, [ids])[0], atol=CLOSE)


def test_bad_nim_embedding_parameters_name_themselves(http: httpx.Client) -> None:
    openai_error(http.post("/v1/embeddings", json={"model": E5, "input": "x", "truncate": "MIDDLE"}), "truncate")
    openai_error(http.post("/v1/embeddings", json={"model": E5, "input": "x", "input_type": "doc"}), "input_type")


# Hugging Face TEI, as Dify's TEI provider calls it


def test_dify_tei_provider_calls(http: httpx.Client) -> None:
    """Dify's huggingface_tei provider: /info (model_type, max_input_length, max_client_batch_size),
    /tokenize to count tokens, /v1/embeddings without a model, /rerank with `texts` and `return_text`."""
    info = http.get("/info").json()
    assert info["model_id"] == EMBED and list(info["model_type"]) == ["embedding"]
    assert info["max_input_length"] == 256 and info["max_client_batch_size"] >= 1

    texts = ["hello world", "Paris is the capital of France."]
    tokens = http.post("/tokenize", json={"inputs": texts}).json()
    assert [len(t) for t in tokens] == [4, 9]  # [CLS] … [SEP]
    assert [t["text"] for t in tokens[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert tokens[0][1] == {"id": tokens[0][1]["id"], "text": "hello", "special": False, "start": 0, "stop": 5}
    assert tokens[0][0]["special"] and tokens[0][0]["start"] is None
    vllm = http.post("/tokenize", json={"model": EMBED, "prompt": texts[0]}).json()
    assert [t["id"] for t in tokens[0]] == vllm["tokens"]

    embeddings = http.post("/v1/embeddings", json={"input": texts}).json()
    assert embeddings["model"] == EMBED and embeddings["usage"]["prompt_tokens"] == 13
    np.testing.assert_allclose([d["embedding"] for d in embeddings["data"]], embedded(http, EMBED, texts),
                               atol=CLOSE)

    ranked = http.post("/rerank", json={"query": QUERY, "texts": PASSAGES, "return_text": True}).json()
    assert ranked[0] == {"index": 1, "text": PASSAGES[1], "score": ranked[0]["score"]}


def test_tei_embed_answers_a_bare_list_of_vectors(http: httpx.Client) -> None:
    one = http.post("/embed", json={"inputs": "hello world"}).json()
    many = http.post("/embed", json={"inputs": ["hello world", "flour"]}).json()
    assert len(one) == 1 and len(many) == 2 and len(many[0]) == 384
    np.testing.assert_allclose(many, embedded(http, EMBED, ["hello world", "flour"]), atol=CLOSE)
    np.testing.assert_allclose(one[0], many[0], atol=CLOSE)


def test_tei_embed_normalize_prompt_name_and_truncate(http: httpx.Client, models_dir: Path) -> None:
    from transformers import AutoTokenizer

    raw = np.array(http.post("/embed", json={"inputs": "flour", "model": HIDDEN, "normalize": False}).json()[0])
    unit = np.array(http.post("/embed", json={"inputs": "flour", "model": HIDDEN}).json()[0])
    assert abs(float(np.linalg.norm(raw)) - 1) > 0.1
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw), atol=CLOSE)

    topic = http.post("/embed", json={"inputs": "flour", "model": E5, "prompt_name": "topic"}).json()[0]
    np.testing.assert_allclose(topic, embedded(http, E5, ["topic: flour"])[0], atol=CLOSE)
    tei_error(http.post("/embed", json={"inputs": "flour", "model": E5, "prompt_name": "nope"}), 400, "Validation")

    tei_error(http.post("/embed", json={"inputs": LONG, "model": E5, "truncate": False}), 400, "Validation")
    cut = http.post("/embed", json={"inputs": LONG, "model": E5, "truncate": True,
                                    "truncation_direction": "Left"}).json()[0]
    tokenizer = AutoTokenizer.from_pretrained(models_dir / EMBED, truncation_side="left")
    ids = tokenizer(LONG, truncation=True, max_length=16)["input_ids"]
    np.testing.assert_allclose(cut, embedded(http, E5, [ids])[0], atol=CLOSE)


def test_tei_errors_in_teis_shape(http: httpx.Client) -> None:
    tei_error(http.post("/embed", json={"inputs": []}), 400, "Empty")
    tei_error(http.post("/tokenize", json={"inputs": []}), 400, "Empty")
    tei_error(http.post("/embed", json={}), 400, "Validation")
    tei_error(http.post("/rerank", json={"query": "q", "texts": []}), 400, "Validation")
    batch = http.get("/info").json()["max_client_batch_size"]
    message = tei_error(http.post("/embed", json={"inputs": ["a"] * (batch + 1)}), 413, "Validation")
    assert str(batch) in message
