"""Beam search on the demo LLMs with a beam interface (FasterTransformer's and TensorRT-LLM's `beam_width`),
through the openai SDK → edge → llm service → real Triton → the demo engine's beam search: the `n` best
beams, best first, as transformers' own beam search finds them on the same weights, streamed and not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from launcher.stack import DEMO_LLMS
from tests.support.stack import DEMO_LLM
from tritongate.demo_models.llm_batch import row_attention
from tritongate.demo_models.llm_linear import pack_linears

BEAMS = [DEMO_LLMS["fastertransformer"], DEMO_LLMS["tensorrt_llm"]]
PROMPT = "Once upon a time there was a small"
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def reference(models_dir: Path, tokenizer: Any) -> list[str]:
    """transformers' two best beams of PROMPT, on the weights and matrix products the demo runs (no length
    penalty: FasterTransformer's and TensorRT-LLM's default)."""
    model = AutoModelForCausalLM.from_pretrained(models_dir / DEMO_LLM, dtype=torch.float32,
                                                 attn_implementation=row_attention()).eval()
    pack_linears(model, 4)
    prompt = tokenizer.encode(PROMPT)
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), num_beams=2, num_return_sequences=2, do_sample=False,
                             max_new_tokens=MAX_TOKENS, length_penalty=0.0, early_stopping=True,
                             pad_token_id=tokenizer.eos_token_id)
    return [tokenizer.decode(row[len(prompt):]) for row in out]


def test_the_demo_llms_with_a_beam_interface_show_their_beams(client: openai.OpenAI) -> None:
    listed = {model.id: model.model_extra or {} for model in client.models.list()}
    assert {name: listed[name]["max_beams"] for name in DEMO_LLMS.values()} == {
        DEMO_LLMS["fastertransformer"]: 4, DEMO_LLMS["tensorrt_llm"]: 4,
        DEMO_LLMS["tensorrt_llm_text"]: 0, DEMO_LLMS["vllm"]: 0}


@pytest.mark.parametrize("model", BEAMS)
def test_the_n_best_beams_best_first_with_their_usage(client: openai.OpenAI, tokenizer: Any, model: str,
                                                      reference: list[str]) -> None:
    result = client.completions.create(model=model, prompt=PROMPT, n=2, max_tokens=MAX_TOKENS,
                                       extra_body={"num_beams": 2})
    choices = sorted(result.choices, key=lambda c: c.index)
    assert [choice.text for choice in choices] == reference
    assert reference[0] != reference[1]
    assert all(choice.finish_reason == "length" for choice in choices)
    assert result.usage is not None
    assert result.usage.prompt_tokens == len(tokenizer.encode(PROMPT))  # once, not once per beam
    assert result.usage.completion_tokens == 2 * MAX_TOKENS  # the returned beams' tokens

    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model=model, prompt=PROMPT, n=2, max_tokens=MAX_TOKENS, stream=True,
                                           extra_body={"num_beams": 2}):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[0], streamed[1]] == reference


@pytest.mark.parametrize("model", BEAMS)
def test_chat_beams_end_at_the_end_id(client: openai.OpenAI, model: str) -> None:
    """Three beams of a short answer: each ends at the end id (a finished hypothesis) or the length."""
    result = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}],
                                            max_tokens=40, n=3, extra_body={"num_beams": 3})
    answers = [choice.message.content for choice in sorted(result.choices, key=lambda c: c.index)]
    assert len(set(answers)) == 3 and all(answers)
    assert {choice.finish_reason for choice in result.choices} <= {"stop", "length"}
    assert "stop" in {choice.finish_reason for choice in result.choices}


def test_more_beams_than_the_model_decodes_are_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=DEMO_LLMS["fastertransformer"], prompt="x", max_tokens=2,
                                  extra_body={"num_beams": 8})
    assert info.value.body["param"] == "num_beams"  # type: ignore[index]
