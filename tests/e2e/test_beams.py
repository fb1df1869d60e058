"""Beam search end to end through the openai SDK (`extra_body={"num_beams": ...}`) → edge → llm service →
real Triton, on every echo model (the `backend` fixture): where the backend has beam search, the `n`
completions of a prompt are its `n` best beams of one Triton request; elsewhere `num_beams` is refused.

The echo models' beam k repeats the prompt from its token k (tests/triton_models/echo_core.py), best first,
so each beam's text is known from the prompt's tokens.
"""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.support.backends import ECHO_BACKENDS, EchoBackend

PROMPT = "alpha beta gamma delta epsilon"
MAX_TOKENS = 4


def beam_texts(tokenizer: Any, prompt: list[int], beams: int, max_tokens: int = MAX_TOKENS) -> list[str]:
    """What the echo's beams generate: beam k repeats the prompt cyclically from its token k."""
    return [tokenizer.decode([prompt[(k + i) % len(prompt)] for i in range(max_tokens)]) for k in range(beams)]


def bad_request(call: Any) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        call()
    error: dict[str, Any] = info.value.body  # type: ignore[assignment]
    return error


def test_the_n_best_beams_of_each_prompt_with_their_usage(client: openai.OpenAI, tokenizer: Any,
                                                          backend: EchoBackend) -> None:
    prompt = list(tokenizer.encode(PROMPT, add_special_tokens=False))
    other = prompt[::-1]
    if not backend.max_beams:
        error = bad_request(lambda: client.completions.create(model=backend.model, prompt=prompt, max_tokens=MAX_TOKENS,
                                                              extra_body={"num_beams": 2}))
        assert error["param"] == "num_beams" and backend.adapter in error["message"]
        return
    result = client.completions.create(model=backend.model, prompt=[prompt, other], n=2, max_tokens=MAX_TOKENS,
                                       extra_body={"num_beams": 3})
    texts = [choice.text for choice in sorted(result.choices, key=lambda c: c.index)]
    assert texts == beam_texts(tokenizer, prompt, 2) + beam_texts(tokenizer, other, 2)
    assert all(choice.finish_reason == "length" for choice in result.choices)
    assert result.usage is not None
    assert result.usage.prompt_tokens == 2 * len(prompt)  # each prompt once, not once per beam
    assert result.usage.completion_tokens == 4 * MAX_TOKENS  # the returned beams' tokens


@pytest.mark.parametrize("backend", [backend for backend in ECHO_BACKENDS if backend.max_beams], ids=str)
def test_chat_beams_stream_and_the_best_beam_is_the_greedy_echo(client: openai.OpenAI, backend: EchoBackend) -> None:
    messages = [{"role": "user", "content": PROMPT}]
    greedy = client.chat.completions.create(model=backend.model, messages=messages,  # type: ignore[arg-type]
                                            max_tokens=MAX_TOKENS, temperature=0)
    beams = client.chat.completions.create(model=backend.model, messages=messages,  # type: ignore[arg-type]
                                           max_tokens=MAX_TOKENS, n=2, extra_body={"num_beams": 2})
    first, second = (choice.message.content for choice in sorted(beams.choices, key=lambda c: c.index))
    assert first == greedy.choices[0].message.content and second and second != first
    streamed: dict[int, str] = {}
    with client.chat.completions.create(model=backend.model, messages=messages,  # type: ignore[arg-type]
                                        max_tokens=MAX_TOKENS, n=2, stream=True, extra_body={"num_beams": 2}) as chunks:
        for chunk in chunks:
            for choice in chunk.choices:
                streamed[choice.index] = streamed.get(choice.index, "") + (choice.delta.content or "")
    assert [streamed[0], streamed[1]] == [first, second]


def test_best_of_with_use_beam_search_is_the_beam_width(http: httpx.Client, tokenizer: Any) -> None:
    prompt = list(tokenizer.encode(PROMPT, add_special_tokens=False))
    response = http.post("/v1/completions", json={"model": "ft-echo", "prompt": prompt, "max_tokens": MAX_TOKENS,
                                                  "n": 2, "best_of": 3, "use_beam_search": True})
    assert response.status_code == 200, response.text
    assert [c["text"] for c in response.json()["choices"]] == beam_texts(tokenizer, prompt, 2)
    refused = http.post("/v1/completions", json={"model": "ft-echo", "prompt": "x", "best_of": 64,
                                                 "use_beam_search": True})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "best_of"


@pytest.mark.parametrize(("extra", "param"), [
    ({"num_beams": 0}, "num_beams"),
    ({"num_beams": 1000}, "num_beams"),
    ({"num_beams": 2, "n": 3}, "n"),
    ({"num_beams": 2, "logprobs": True}, "logprobs"),
], ids=["num_beams 0", "num_beams 1000", "n above num_beams", "logprobs with beams"])
@pytest.mark.parametrize("backend", ECHO_BACKENDS, ids=str)
def test_bad_beams_are_400s_naming_the_parameter(client: openai.OpenAI, backend: EchoBackend, extra: dict[str, Any],
                                                 param: str) -> None:
    """On a backend without beam search, `num_beams` is what is refused, unless the request fails earlier
    (log probabilities on a backend that has none)."""
    fields = {"n": extra.get("n", 1), "logprobs": extra.get("logprobs", False)}
    error = bad_request(lambda: client.chat.completions.create(
        model=backend.model, messages=[{"role": "user", "content": "x"}], max_tokens=2, **fields,
        extra_body={"num_beams": extra["num_beams"]}))
    if not backend.max_beams and param != "num_beams":
        param = "logprobs" if param == "logprobs" and not backend.logprobs else "num_beams"
    assert error["param"] == param, error


def test_ft_takes_only_its_beam_widths(client: openai.OpenAI) -> None:
    error = bad_request(lambda: client.completions.create(model="ft-echo", prompt="x", max_tokens=2,
                                                          extra_body={"num_beams": 5}))
    assert error["param"] == "num_beams" and "one of 1, 2, 3, 4, 8, 16, 32" in error["message"]


def test_models_show_max_beams(client: openai.OpenAI) -> None:
    listed = {model.id: model.model_extra or {} for model in client.models.list()}
    for backend in ECHO_BACKENDS:
        assert listed[backend.model]["max_beams"] == backend.max_beams
