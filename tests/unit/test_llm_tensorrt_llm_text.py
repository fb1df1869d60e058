"""The TensorRT-LLM text adapter (`ensemble`, `tensorrt_llm_bls`): the tensors it sends, delta and
accumulated text, token counts, refusals."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Sampling
from services.llm.tensorrt_llm_text import TensorRTLLMText
from tests.support.fake_triton import FakeModel, FakeTriton, texts, triton_config

# tensorrtllm_backend's all_models/inflight_batcher_llm/ensemble (2025-05 names), the inputs the adapter uses.
INPUTS = {"text_input": "STRING", "max_tokens": "INT32", "bad_words": "STRING", "stop_words": "STRING",
          "exclude_input_in_output": "BOOL", "end_id": "INT32", "top_k": "INT32", "top_p": "FP32",
          "temperature": "FP32", "repetition_penalty": "FP32", "min_tokens": "INT32", "presence_penalty": "FP32",
          "frequency_penalty": "FP32", "seed": "UINT64", "return_log_probs": "BOOL", "stream": "BOOL",
          "return_num_input_tokens": "BOOL", "return_num_output_tokens": "BOOL"}
OUTPUTS = {"text_output": "STRING", "num_input_tokens": "INT32", "num_output_tokens": "INT32"}
OLD = {**{k: v for k, v in INPUTS.items() if k not in ("seed", "min_tokens", "return_num_input_tokens",
                                                          "return_num_output_tokens")},
       "random_seed": "UINT64", "min_length": "INT32"}
ENSEMBLE: dict[str, Any] = {"platform": "ensemble", "decoupled": False}  # an ensemble has no transaction policy
BLS: dict[str, Any] = {"backend": "python"}


def adapter(inputs: dict[str, str] = INPUTS, outputs: dict[str, str] = OUTPUTS, calling: tuple[Any, Any] = (None, None),
            accumulate: bool | None = None, **config: Any) -> TensorRTLLMText:
    """The adapter calling a FakeTriton's model (`FakeTriton.calling`), or none (for what needs no Triton)."""
    text = TensorRTLLMText(*calling, "m", accumulate_tokens=accumulate)
    text.configure(triton_config(inputs, outputs, **(config or ENSEMBLE)))
    return text


def sampling(**fields: Any) -> Sampling:
    return Sampling(**{"max_new_tokens": 7, "greedy": False, "temperature": 0.7, "top_k": 40, "top_p": 0.9,
                       "seed": 5, "end_id": 2, **fields})


def test_tensors_names_types_and_shapes() -> None:
    tensors = adapter().tensors("Hi 😀", sampling(stop=["\n\n", "END", ""], bad=["darn"], min_tokens=0,
                                                  frequency_penalty=0.5))
    assert tensors["text_input"].dtype == np.object_ and tensors["text_input"].tolist() == [["Hi 😀".encode()]]
    assert tensors["max_tokens"].dtype == np.int32 and tensors["max_tokens"].tolist() == [[7]]
    assert tensors["stream"].tolist() == [[True]] and tensors["exclude_input_in_output"].tolist() == [[True]]
    assert tensors["end_id"].tolist() == [[2]] and tensors["top_k"].tolist() == [[40]]
    assert tensors["seed"].dtype == np.uint64 and tensors["frequency_penalty"].tolist() == [[0.5]]
    assert tensors["stop_words"].tolist() == [[b"\n\n", b"END"]]  # one string per word, the empty one dropped
    assert tensors["bad_words"].tolist() == [[b"darn"]]
    assert tensors["return_num_input_tokens"].tolist() == [[True]]
    assert not {"min_tokens", "repetition_penalty", "presence_penalty", "return_log_probs"} & tensors.keys()


def test_older_names_greedy_and_ignore_eos() -> None:
    tensors = adapter(OLD).tensors("x", sampling(greedy=True, ignore_eos=True, min_tokens=3, stop=["END"]))
    assert tensors["random_seed"].tolist() == [[5]] and tensors["min_length"].tolist() == [[3]]
    assert tensors["top_k"].tolist() == [[1]] and "top_p" not in tensors and "temperature" not in tensors
    assert tensors["end_id"].tolist() == [[-1]]  # TensorRT-LLM: no end id
    assert "stop_words" not in tensors  # with min_tokens the service matches stops
    assert "return_num_output_tokens" not in tensors


def test_knobs() -> None:
    model = adapter()
    assert all(model.supports(k) for k in ("presence_penalty", "frequency_penalty", "seed", "top_k", "min_tokens",
                                           "repetition_penalty", "ignore_eos", "bad_words", "stop_words"))
    assert not any(model.supports(k) for k in ("logprobs", "top_logprobs", "logit_bias", "min_p", "special_tokens"))
    bare = adapter({"text_input": "STRING", "max_tokens": "INT32"}, {"text_output": "STRING"})
    assert not bare.supports("ignore_eos") and not bare.supports("seed")


def test_refusals() -> None:
    with pytest.raises(ServiceError) as info:
        adapter({"text_input": "STRING"}, {"text_output": "STRING"})
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "max_tokens" in info.value.message
    with pytest.raises(ServiceError, match="must be decoupled"):
        adapter(decoupled=False, **BLS)


def test_accumulation_comes_from_the_bls_parameter_unless_the_config_file_says() -> None:
    param: dict[str, Any] = {"parameters": {"accumulate_tokens": {"string_value": "True"}}, **BLS}
    assert adapter(**param).accumulate and not adapter(**BLS).accumulate
    assert not adapter(accumulate=False, **param).accumulate and adapter(accumulate=True, **BLS).accumulate


def counted(*pieces: tuple[str, int]) -> list[dict[str, np.ndarray]]:
    responses = texts(*(piece for piece, _ in pieces))
    for response, (_, tokens) in zip(responses, pieces, strict=True):
        response["num_output_tokens"] = np.array([[tokens]], dtype=np.int32)
        response["num_input_tokens"] = np.array([[4]], dtype=np.int32)
    return responses


async def test_delta_text_and_counts() -> None:
    async with FakeTriton({"m": FakeModel(triton_config(INPUTS, OUTPUTS, **ENSEMBLE),
                                          [*counted(("Hel", 1), ("lo", 1), ("", 0)), {}])}) as triton:
        model = adapter(calling=await triton.calling("m"))
        steps = [s async for s in model.stream([1], sampling(request_id="r-0"), None, text="Say")]
    assert [(s.text, s.tokens, s.prompt_tokens) for s in steps] == [("Hel", 1, 4), ("lo", 1, 4), ("", 0, 4)]
    assert triton.requests[0].outputs == ["text_output", "num_input_tokens", "num_output_tokens"]
    assert triton.requests[0].inputs["text_input"].tolist() == [[b"Say"]] and triton.requests[0].request_id == "r-0"


async def test_accumulated_text_becomes_deltas_and_waits_for_whole_characters() -> None:
    inputs, outputs = {"text_input": "STRING", "max_tokens": "INT32", "stream": "BOOL"}, {"text_output": "STRING"}
    async with FakeTriton({"m": FakeModel(triton_config(inputs, outputs, **BLS),
                                          texts("Hi", "Hi \ufffd", "Hi 😀", "Hi 😀 ok", "Hi 😀 ok\ufffd"))}) as triton:
        model = adapter(inputs, outputs, calling=await triton.calling("m"), accumulate=True, **BLS)
        steps = [s async for s in model.stream([1], sampling(), None, text="x")]
    assert [s.text for s in steps] == ["Hi", " ", "😀", " ok", "", "\ufffd"]  # the end releases what was held
    assert all(s.tokens is None for s in steps[:-1])  # no counts: the service counts with the tokenizer


async def test_reused_kv_cache_blocks_are_cached_prompt_tokens() -> None:
    inputs, outputs = {**INPUTS, "return_perf_metrics": "BOOL"}, {**OUTPUTS, "kv_cache_reused_blocks": "INT32"}
    answers = [{**answer, "kv_cache_reused_blocks": np.array([[2]], dtype=np.int32)}
               for answer in counted(("Hel", 1), ("lo", 1))]
    async with FakeTriton({"m": FakeModel(triton_config(inputs, outputs, **ENSEMBLE), answers)}) as triton:
        model = TensorRTLLMText(*await triton.calling("m"), "m", tokens_per_block=32)
        model.configure(triton_config(inputs, outputs, **ENSEMBLE))
        steps = [s async for s in model.stream([1], sampling(), None, text="Say")]
    assert [s.cached_tokens for s in steps] == [64, 64]
    assert triton.requests[0].inputs["return_perf_metrics"].tolist() == [[True]]
    assert triton.requests[0].outputs[-1] == "kv_cache_reused_blocks"
    assert "return_perf_metrics" not in adapter().tensors("x", sampling())  # a model that does not report reuse
