"""One LanguageModel on a scripted Triton, through each kind of backend: the prompt it sends, steps through
the shared generation path (stop strings, n choices with seed + i, usage), knob refusals naming the
backend, and a Triton model no adapter can drive (not ready, logged at ERROR, told to requests)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from services.common import triton as triton_client
from services.common.errors import ServiceError
from services.llm.model import LanguageModel
from tests.support.fake_triton import Arrays, FakeModel, FakeTriton, texts, triton_config
from tests.support.stack import DEMO_LLM
from tests.unit.test_llm_tensorrt_llm import INPUTS as TRT_INPUTS
from tests.unit.test_llm_tensorrt_llm import OUTPUTS as TRT_OUTPUTS
from tests.unit.test_llm_vllm import INPUTS as VLLM_INPUTS
from tests.unit.test_llm_vllm import OUTPUTS as VLLM_OUTPUTS
from tritongate.config import LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2

ENSEMBLE = triton_config({"text_input": "STRING", "max_tokens": "INT32", "stop_words": "STRING", "end_id": "INT32",
                          "stream": "BOOL"}, {"text_output": "STRING"}, platform="ensemble", decoupled=False)
VLLM = triton_config(VLLM_INPUTS, VLLM_OUTPUTS, batched=False, backend="vllm")


def serving(config: dict[str, Any], responses: list[Arrays] | None = None) -> FakeTriton:
    """A Triton serving model `m` with `config`, answering every request with `responses`."""
    return FakeTriton({"m": FakeModel(config, responses or [])})


def model(models_dir: Path, triton: FakeTriton, info: ModelInfo | None = None, **fields: Any) -> LanguageModel:
    entry = LlmModel(name="m", url=triton.address, path=str(models_dir / DEMO_LLM), **fields)
    return LanguageModel(entry, info or ModelInfo(name="m", max_len=256), triton.client)


async def generate(llm: LanguageModel, **fields: Any) -> list[llm_pb2.GenerateResponse]:
    return [r async for r in llm.generate(llm_pb2.GenerateRequest(model="m", **fields), None)]


def chat(text: str) -> llm_pb2.Chat:
    return llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content=text)])


def prompts(*values: str | list[int]) -> llm_pb2.Prompts:
    from tritongate.common.v1 import common_pb2

    return llm_pb2.Prompts(prompts=[llm_pb2.Prompt(text=v) if isinstance(v, str) else
                                    llm_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=v)) for v in values])


def choice_texts(responses: list[llm_pb2.GenerateResponse], index: int = 0) -> str:
    return "".join(r.delta.text for r in responses if r.WhichOneof("event") == "delta" and r.delta.index == index)


def finish(responses: list[llm_pb2.GenerateResponse], index: int = 0) -> str:
    return next(r.delta.finish_reason for r in responses
                if r.WhichOneof("event") == "delta" and r.delta.index == index and r.delta.finish_reason)


def vllm_steps(*pieces: tuple[str, int, str]) -> list[dict[str, np.ndarray]]:
    return [{"text_output": np.array([text.encode()], dtype=np.object_),
             "finish_reason": np.array([reason.encode()], dtype=np.object_),
             "num_input_tokens": np.array([11], dtype=np.uint32),
             "num_output_tokens": np.array([tokens], dtype=np.uint32)} for text, tokens, reason in pieces]


async def test_vllm_gets_the_rendered_chat_and_n_choices_with_their_seeds(models_dir: Path) -> None:
    async with serving(VLLM, vllm_steps(("Hello", 1, "None"), (" wor", 1, "None"), ("ld", 1, "length"))) as triton:
        llm = model(models_dir, triton)
        responses = await generate(llm, chat=chat("Hi"), n=2, seed=7, max_tokens=3, stop=["wor"],
                                    chat_template_kwargs={"unused": True})
        assert [choice_texts(responses, i) for i in (0, 1)] == ["Hello ", "Hello "]
        assert finish(responses) == "stop"
        sent = [r.inputs for r in triton.requests]
        assert sent[0]["text_input"][0].decode().endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
        params = [json.loads(inputs["sampling_parameters"][0]) for inputs in sent]
        assert [p["seed"] for p in params] == [7, 8] and params[0]["stop"] == ["wor"] and params[0]["max_tokens"] == 3
        usage = responses[-1].usage
        assert (usage.prompt_tokens, usage.completion_tokens) == (11, 4)  # vLLM's counts: 11 once, 2 per choice


async def test_vllm_length_and_ignore_eos(models_dir: Path) -> None:
    async with serving(VLLM, vllm_steps(("a b c", 3, "length"))) as triton:
        responses = await generate(model(models_dir, triton), prompts=prompts("x"), max_tokens=3, ignore_eos=True,
                                   min_p=0.1)
        assert choice_texts(responses) == "a b c" and finish(responses) == "length"
        params = json.loads(triton.requests[0].inputs["sampling_parameters"][0])
        assert params["ignore_eos"] is True and params["min_p"] == pytest.approx(0.1)


async def test_the_ensemble_without_counts_is_counted_with_the_tokenizer(models_dir: Path) -> None:
    async with serving(ENSEMBLE, texts("one", " two", " three")) as triton:
        responses = await generate(model(models_dir, triton), prompts=prompts([1, 2, 3]), max_tokens=3)
        assert choice_texts(responses) == "one two three" and finish(responses) == "length"
        assert responses[-1].usage.completion_tokens == 3 and responses[-1].usage.prompt_tokens == 3
        inputs = triton.requests[0].inputs
        assert inputs["text_input"].tolist() == [[b"<|im_start|><|im_end|><repo_name>"]]  # token ids as text
        assert inputs["end_id"].tolist() == [[2]]


async def test_the_ensemble_stops_on_a_model_infos_stop_word_as_text(models_dir: Path, tokenizer: Any) -> None:
    info = ModelInfo(name="m", max_len=256, stop_words=[tokenizer.encode(" END", add_special_tokens=False)])
    async with serving(ENSEMBLE, texts("done", " E", "ND", " more")) as triton:
        responses = await generate(model(models_dir, triton, info), prompts=prompts("x"), max_tokens=9)
        assert choice_texts(responses) == "done" and finish(responses) == "stop"
        assert triton.requests[0].inputs["stop_words"].tolist() == [[b" END"]]


async def test_tensorrt_llm_ignoring_the_end_id(models_dir: Path, tokenizer: Any) -> None:
    tokens = [*tokenizer.encode("a", add_special_tokens=False), 2, *tokenizer.encode("b", add_special_tokens=False)]
    responses_ = [{"output_ids": np.array([[[t]]], dtype=np.int32), "sequence_length": np.array([[1]], dtype=np.int32)}
                  for t in tokens]
    async with serving(triton_config(TRT_INPUTS, TRT_OUTPUTS), responses_) as triton:
        responses = await generate(model(models_dir, triton), prompts=prompts("x"), max_tokens=3, ignore_eos=True)
        assert choice_texts(responses) == "ab" and finish(responses) == "length"
        assert "end_id" not in triton.requests[0].inputs
        responses = await generate(model(models_dir, triton), prompts=prompts("x"), max_tokens=3)
        assert choice_texts(responses) == "a" and finish(responses) == "stop"


@pytest.mark.parametrize(("config", "fields", "param", "backend"), [
    (VLLM, {"logit_bias": {5: -100}}, "logit_bias", "vllm"),
    (ENSEMBLE, {"logprobs": True}, "logprobs", "tensorrt_llm_text"),
    (ENSEMBLE, {"skip_special_tokens": False}, "skip_special_tokens", "tensorrt_llm_text"),
    (triton_config(TRT_INPUTS, TRT_OUTPUTS), {"logprobs": True, "top_logprobs": 2}, "top_logprobs", "tensorrt_llm"),
    (triton_config(TRT_INPUTS, TRT_OUTPUTS), {"min_p": 0.2}, "min_p", "tensorrt_llm"),
])
async def test_knobs_a_backend_lacks_are_refused_naming_it(models_dir: Path, config: dict[str, Any],
                                                           fields: dict[str, Any], param: str, backend: str) -> None:
    with pytest.raises(ServiceError) as info:
        async with serving(config) as triton:
            await generate(model(models_dir, triton), prompts=prompts("x"), **fields)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.param == param
    assert f"by the {backend} backend" in info.value.message


async def test_a_model_no_adapter_drives_is_not_ready_and_says_why(models_dir: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    async with serving(triton_config({"INPUT_0": "STRING"}, {"OUTPUT_0": "STRING"}, platform="ensemble")) as triton:
        llm = model(models_dir, triton)
        with caplog.at_level(logging.ERROR, logger="services.llm.model"):
            assert not await llm.refresh() and not await llm.refresh()
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "INPUT_0 BYTES" in errors[0].getMessage()  # once per reason
        with pytest.raises(ServiceError) as info:
            await generate(llm, prompts=prompts("x"))
        assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "matches none" in info.value.message
        triton.models["m"].config = VLLM  # the Triton model was replaced by a vLLM one
        assert await llm.refresh() and llm.backend.name == "vllm" and llm.refusal is None


async def test_a_ready_model_outlasts_two_unanswered_readiness_checks_not_three(
        models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy Triton answers late; only a Triton that stays silent takes the model out of service."""
    monkeypatch.setattr(triton_client, "READINESS_TIMEOUT_S", 0.2)  # how long a check waits for the answer
    async with serving(VLLM) as triton:
        llm = model(models_dir, triton)
        assert await llm.refresh()
        triton.models["m"].ready = None
        assert await llm.refresh() and await llm.refresh()
        assert not await llm.refresh()
        with pytest.raises(ServiceError) as info:
            await llm.ensure_ready()
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
        assert info.value.message.endswith("Triton gave its readiness check no answer within 0 s (4 in a row)")
        triton.models["m"].ready = True
        assert await llm.refresh() and llm.ready
        triton.models["m"].ready = None  # the count starts again after an answer
        assert await llm.refresh()


async def test_model_infos_bad_words_refuse_a_vllm_model(models_dir: Path) -> None:
    async with serving(VLLM) as triton:
        llm = model(models_dir, triton, ModelInfo(name="m", bad_words=[[5]]))
        assert not await llm.refresh() and "bad_words" in (llm.refusal or "")


def trt_answer(tokens: list[int], reused_blocks: int) -> list[Arrays]:
    return [{"output_ids": np.array([[[t]]], dtype=np.int32), "sequence_length": np.array([[1]], dtype=np.int32),
             "kv_cache_reused_blocks": np.array([[reused_blocks]], dtype=np.int32)} for t in tokens]


async def test_cached_tokens_are_counted_once_per_prompt_and_never_above_it(models_dir: Path, tokenizer: Any) -> None:
    config = triton_config({**TRT_INPUTS, "return_perf_metrics": "BOOL"},
                           {**TRT_OUTPUTS, "kv_cache_reused_blocks": "INT32"})
    long, short = "one two three four five six seven eight nine ten", "one"
    async with serving(config, trt_answer(tokenizer.encode("ab", add_special_tokens=False), 2)) as triton:
        llm = model(models_dir, triton, tokens_per_block=4)
        responses = await generate(llm, prompts=prompts(long, short), n=2, max_tokens=2)
        usage = responses[-1].usage
        assert usage.prompt_tokens == len(tokenizer.encode(long, add_special_tokens=False)) + 1
        assert usage.cached_tokens == 8 + 1  # 2 blocks of 4 for the long prompt, all of the one-token prompt
    async with serving(triton_config(TRT_INPUTS, TRT_OUTPUTS), trt_answer([5], 0)) as triton:
        responses = await generate(model(models_dir, triton), prompts=prompts(long), max_tokens=1)
        assert responses[-1].usage.cached_tokens == 0  # a backend that does not report reuse


GUIDED_TRT = triton_config({**TRT_INPUTS, "guided_decoding_guide_type": "STRING", "guided_decoding_guide": "STRING"},
                           TRT_OUTPUTS)


async def test_a_forced_custom_tool_sends_its_grammar_and_answers_with_the_raw_input(models_dir: Path,
                                                                                     tokenizer: Any) -> None:
    tool = llm_pb2.Tool(name="shell", custom=True, grammar=llm_pb2.Guide(grammar='root ::= "ls" " -l"?'))
    forced = llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content="List")], tools=[tool],
                          tool_choice=llm_pb2.ToolChoice(function="shell"))
    async with serving(GUIDED_TRT, trt_answer(tokenizer.encode(" ls -l", add_special_tokens=False), 0)) as triton:
        responses = await generate(model(models_dir, triton), chat=forced, max_tokens=5)
        inputs = triton.requests[0].inputs
        assert inputs["guided_decoding_guide_type"].tolist() == [[b"ebnf_grammar"]]
        assert inputs["guided_decoding_guide"].tolist() == [[b'root ::= "ls" " -l"?']]
    pieces = [call for r in responses if r.WhichOneof("event") == "delta" for call in r.delta.tool_calls]
    assert pieces[0].name == "shell" and "".join(p.arguments for p in pieces) == " ls -l"
    assert finish(responses) == "tool_calls" and choice_texts(responses) == ""


async def test_hosted_tools_are_refused_where_the_model_is_configured_to(models_dir: Path) -> None:
    hosted = [llm_pb2.HostedTool(type="web_search_20250305", param="tools[3]")]
    async with serving(VLLM, vllm_steps(("ok", 1, "stop"))) as triton:
        served = await generate(model(models_dir, triton), prompts=prompts("x"), hosted_tools=hosted)
        assert choice_texts(served) == "ok"  # "ignore", the default
        with pytest.raises(ServiceError) as info:
            await generate(model(models_dir, triton, hosted_tools="refuse"), prompts=prompts("x"), hosted_tools=hosted)
        assert info.value.param == "tools[3]" and "configured to refuse" in info.value.message
