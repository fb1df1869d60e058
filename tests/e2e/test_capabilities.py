"""/v1/models tells the truth, on the session's stack (every demo LLM of `tritongate up --demo-llm all` and
the echo models): each capability a model advertises is tried on it and succeeds; the demo vLLM model's
images reach its prompt where they stand; and a Triton model's refusal of a request is a 400 with the
model's reason, not a server error."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from tests.support.stack import DEMO_LLM

DEMO_VLLM = f"{DEMO_LLM}-vllm"
# Variants that fail or stall on purpose (tests.support.backends), not capabilities.
ON_PURPOSE = ("-failing", "-slow", "-interval")
# An adapter configured on a backend without LoRA, kept to check that refusal (test_lora.py).
MISCONFIGURED = {"ft-doll"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CITY = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"]}}}


def png(size: tuple[int, int], colour: tuple[int, int, int]) -> str:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def user(text: str, *images: str) -> list[dict[str, Any]]:
    parts = [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return [{"role": "user", "content": [*parts, {"type": "text", "text": text}]}]


def chat(model: str, **fields: Any) -> dict[str, Any]:
    return {"model": model, "max_tokens": 4, "temperature": 0, "messages": user("Say hi."), **fields}


def advertised(card: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A request for each capability the model's card advertises."""
    model = card["id"]
    tries = {"chat": chat(model)}
    if card["image_input"]:
        tries["image_input"] = chat(model, messages=user("What is in the picture?", png((16, 8), (200, 30, 30))))
    if card["max_beams"]:
        tries["max_beams"] = chat(model, n=2, num_beams=min(2, card["max_beams"]))
    if card["reasoning"]:
        tries["reasoning"] = chat(model, max_tokens=16)
    return tries


def test_every_capability_a_model_advertises_succeeds(http: httpx.Client) -> None:
    cards = [card for card in http.get("/v1/models").json()["data"] if card["max_beams"] is not None  # the LLMs
             and not card["id"].endswith(ON_PURPOSE) and card["id"] not in MISCONFIGURED]
    assert {DEMO_LLM, f"{DEMO_LLM}-trtllm", f"{DEMO_LLM}-trtllm-ensemble", DEMO_VLLM} <= {c["id"] for c in cards}
    failures, tried = [], set()
    for card in cards:
        for capability, body in advertised(card).items():
            tried.add(capability)
            response = http.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                failures.append(f"{card['id']} {capability}: {response.status_code} {response.text[:300]}")
            elif capability == "max_beams" and len(response.json()["choices"]) != 2:
                failures.append(f"{card['id']} beams: {len(response.json()['choices'])} choices for n=2")
    assert not failures, "\n".join(failures)
    assert {"chat", "image_input", "max_beams", "reasoning"} <= tried  # the walk met each kind somewhere


@pytest.mark.parametrize("model", [DEMO_LLM, f"{DEMO_LLM}-trtllm", f"{DEMO_LLM}-trtllm-ensemble", DEMO_VLLM])
def test_tools_and_structured_output_are_served_or_refused_never_a_server_error(http: httpx.Client,
                                                                                 model: str) -> None:
    """Neither is a capability of /v1/models: each demo LLM serves it or refuses it for what it is (400)."""
    for body, param in ((chat(model, tools=[WEATHER], max_tokens=8), "tools"),
                        (chat(model, response_format=CITY, max_tokens=8), "response_format")):
        response = http.post("/v1/chat/completions", json=body)
        assert response.status_code in (200, 400), response.text
        if response.status_code == 400:
            assert response.json()["error"]["param"] == param, response.text


def test_the_demo_vllm_model_sees_each_image_where_it_stands(client: openai.OpenAI) -> None:
    """Its caption of the image (size, dominant colour) takes the image's place in the prompt: the same
    prompt as the caption written there by hand, token for token, and so the same greedy answer."""
    question = "What is in the picture? Answer in a few words."
    for size, colour, caption in (((64, 32), (230, 20, 20), "[image: 64x32, mostly red]"),
                                  ((8, 6), (20, 60, 210), "[image: 8x6, mostly blue]")):
        seen = client.chat.completions.create(model=DEMO_VLLM, max_tokens=12, temperature=0,
                                              messages=user(question, png(size, colour)))  # type: ignore[arg-type]
        told = client.chat.completions.create(model=DEMO_VLLM, max_tokens=12, temperature=0,
                                              messages=[{"role": "user", "content": f"{caption}\n{question}"}])
        assert seen.usage is not None and told.usage is not None
        assert seen.usage.prompt_tokens == told.usage.prompt_tokens  # counted by the model, captions in place
        assert seen.choices[0].message.content == told.choices[0].message.content


def test_a_triton_models_refusal_is_a_400_with_its_reason(client: openai.OpenAI) -> None:
    """A PNG file that is not one passes the edge's check of its first bytes; the demo vLLM model cannot
    decode it and refuses the request (TritonError INVALID_ARG), as vLLM refuses an unreadable image."""
    broken = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=DEMO_VLLM, max_tokens=4,
                                       messages=user("What is in the picture?", broken))  # type: ignore[arg-type]
    error = refused.value.body
    assert isinstance(error, dict)
    assert "an image cannot be decoded" in error["message"] and DEMO_VLLM in error["message"]
    assert error["param"] == "messages" and error["type"] == "invalid_request_error"
    with pytest.raises(openai.APIError) as streamed:  # streamed: the stream's error event says the same
        list(client.chat.completions.create(model=DEMO_VLLM, max_tokens=4, stream=True,
                                            messages=user("What is in the picture?", broken)))  # type: ignore[arg-type]
    assert "an image cannot be decoded" in streamed.value.message
    assert (streamed.value.type, streamed.value.param) == ("invalid_request_error", "messages")
