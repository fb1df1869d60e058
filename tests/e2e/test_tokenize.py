"""POST /tokenize and POST /detokenize on the whole stack, for an LLM, an embedding and a rerank model,
against the models' own tokenizers (vLLM's request and response shapes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from transformers import AutoTokenizer

SMOLLM2 = "smollm2-135m-instruct"
EMBED = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
TEXT = "The capital of France is Paris."


def post(http: httpx.Client, path: str, **body: Any) -> httpx.Response:
    return http.post(path, json=body)


def test_an_llm_prompt_and_chat_tokenize_as_its_tokenizer_does(http: httpx.Client, tokenizer: Any) -> None:
    result = post(http, "/tokenize", model=SMOLLM2, prompt=TEXT).json()
    assert result == {"count": len(result["tokens"]), "max_model_len": 8192, "tokens": tokenizer.encode(TEXT)}
    assert post(http, "/detokenize", model=SMOLLM2, tokens=result["tokens"]).json() == {"prompt": TEXT}
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    chat = post(http, "/tokenize", model=SMOLLM2, messages=messages).json()
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    # The count is the prompt_tokens that chat reports for the same messages.
    usage = post(http, "/v1/chat/completions", model=SMOLLM2, messages=messages, max_tokens=1).json()["usage"]
    assert chat["count"] == usage["prompt_tokens"]


@pytest.mark.parametrize("model", [EMBED, RERANK])
def test_encoder_models_tokenize_with_their_own_tokenizer(http: httpx.Client, models_dir: Path, model: str) -> None:
    own = AutoTokenizer.from_pretrained(models_dir / "all-minilm-l6-v2") if model == EMBED else None
    result = post(http, "/tokenize", model=model, prompt=TEXT).json()
    assert result["count"] == len(result["tokens"]) > 2 and result["max_model_len"] >= 0
    if own is not None:
        assert result["tokens"] == own.encode(TEXT)
    plain = post(http, "/tokenize", model=model, prompt=TEXT, add_special_tokens=False).json()["tokens"]
    assert plain == result["tokens"][1:-1]  # without [CLS] ... [SEP]
    assert post(http, "/detokenize", model=model, tokens=plain).json()["prompt"].lower() == TEXT.lower()


BAD = [
    ("unknown model", "/tokenize", {"model": "no-such-model", "prompt": "hi"}, 404, "model"),
    ("unknown model", "/detokenize", {"model": "no-such-model", "tokens": [1]}, 404, "model"),
    ("token outside the vocabulary", "/detokenize", {"model": SMOLLM2, "tokens": [1, 10**9]}, 400, "tokens"),
    ("token outside the vocabulary", "/detokenize", {"model": EMBED, "tokens": [10**6]}, 400, "tokens"),
    ("negative token", "/detokenize", {"model": SMOLLM2, "tokens": [-1]}, 400, "tokens[0]"),
    ("neither prompt nor messages", "/tokenize", {"model": SMOLLM2}, 400, "prompt"),
    ("both prompt and messages", "/tokenize", {"model": SMOLLM2, "prompt": "a",
                                               "messages": [{"role": "user", "content": "b"}]}, 400, "messages"),
    ("a chat for a model without a chat template", "/tokenize",
     {"model": EMBED, "messages": [{"role": "user", "content": "b"}]}, 400, "messages"),
    ("unknown role", "/tokenize", {"model": SMOLLM2, "messages": [{"role": "robot", "content": "b"}]}, 400,
     "messages[0].role"),
]


@pytest.mark.parametrize(("case", "path", "body", "status", "param"), BAD, ids=[f"{b[1]} {b[0]}" for b in BAD])
def test_bad_input(http: httpx.Client, case: str, path: str, body: dict[str, Any], status: int, param: str) -> None:
    response = http.post(path, json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param
