"""The FasterTransformer adapter: word lists, the tensors it sends, and cumulative output → new tokens."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc
import numpy as np
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Sampling
from services.llm.fastertransformer import FasterTransformer, encode_words
from tests.support.fake_triton import FakeModel, FakeTriton

FT_INPUTS = {"input_ids": "UINT32", "input_lengths": "UINT32", "request_output_len": "UINT32",
             "runtime_top_k": "UINT32", "runtime_top_p": "FP32", "temperature": "FP32", "repetition_penalty": "FP32",
             "presence_penalty": "FP32", "random_seed": "UINT64", "is_return_log_probs": "BOOL", "end_id": "UINT32",
             "start_id": "UINT32", "stop_words_list": "INT32", "bad_words_list": "INT32", "len_penalty": "FP32"}


def ft_config(inputs: Mapping[str, str] = FT_INPUTS, log_probs: bool = True) -> dict[str, Any]:
    outputs = ["output_ids", "sequence_length", *(["output_log_probs"] if log_probs else [])]
    return {"input": [{"name": name, "data_type": f"TYPE_{kind}"} for name, kind in inputs.items()],
            "output": [{"name": name, "data_type": "TYPE_UINT32"} for name in outputs]}


def test_word_list_layout() -> None:
    words = encode_words([[5], [7, 8, 9], [11]])
    assert words.dtype == np.int32 and words.shape == (1, 2, 5)
    assert words[0].tolist() == [[5, 7, 8, 9, 11], [1, 4, 5, -1, -1]]
    assert encode_words([]).tolist() == [[[0], [-1]]]


def test_tensors_follow_the_declared_types_and_skip_undeclared_inputs() -> None:
    inputs = {k: v for k, v in FT_INPUTS.items() if k not in ("presence_penalty", "bad_words_list")}
    adapter = FasterTransformer(None, "u", "m", {"len_penalty": 0.5})  # type: ignore[arg-type]
    adapter.configure(ft_config(inputs))
    sampling = Sampling(max_new_tokens=7, greedy=False, temperature=0.7, top_k=40, top_p=0.9, seed=2**64 - 1,
                        end_id=2, stop_words=[[13]], bad_words=[[99]], presence_penalty=0.5)
    tensors = adapter.tensors([10, 11, 12], sampling)
    assert tensors["input_ids"].dtype == np.uint32 and tensors["input_ids"].tolist() == [[10, 11, 12]]
    assert tensors["input_lengths"].tolist() == [[3]] and tensors["request_output_len"].tolist() == [[7]]
    assert tensors["runtime_top_k"].tolist() == [[40]] and tensors["temperature"].dtype == np.float32
    assert tensors["random_seed"].dtype == np.uint64 and int(tensors["random_seed"][0, 0]) == 2**64 - 1
    assert tensors["stop_words_list"].tolist() == [[[13], [1]]] and tensors["len_penalty"].tolist() == [[0.5]]
    assert "presence_penalty" not in tensors and "bad_words_list" not in tensors and "start_id" not in tensors
    assert "is_return_log_probs" not in tensors
    assert not adapter.supports("presence_penalty") and not adapter.supports("frequency_penalty")
    assert adapter.supports("logprobs") and adapter.supports("stop_words")


def test_greedy_is_top_k_1() -> None:
    adapter = FasterTransformer(None, "u", "m")  # type: ignore[arg-type]
    adapter.configure(ft_config())
    tensors = adapter.tensors([1], Sampling(max_new_tokens=1, greedy=True, temperature=0.0, top_p=0.5))
    assert tensors["runtime_top_k"].tolist() == [[1]] and tensors["runtime_top_p"].tolist() == [[0.0]]
    assert tensors["temperature"].tolist() == [[1.0]]


def test_a_model_without_the_ft_interface_is_refused() -> None:
    adapter = FasterTransformer(None, "u", "m", {"delay_ms": 1})  # type: ignore[arg-type]
    with pytest.raises(ServiceError) as info:
        adapter.configure(ft_config({"input_ids": "UINT32"}, log_probs=False))
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "input_lengths, request_output_len, delay_ms" in info.value.message


def ft_response(sequence: list[int], width: int, log_probs: list[float]) -> dict[str, np.ndarray]:
    ids = np.full((1, 1, width), 2, dtype=np.uint32)
    ids[0, 0, : len(sequence)] = sequence
    per_token = np.zeros((1, 1, width - 3), dtype=np.float32)
    per_token[0, 0, : len(log_probs)] = log_probs
    return {"output_ids": ids, "sequence_length": np.array([[len(sequence)]], dtype=np.uint32),
            "output_log_probs": per_token}


async def test_cumulative_outputs_become_new_tokens() -> None:
    prompt = [7, 8, 9]
    async with FakeTriton({"m": FakeModel(ft_config(), [
        ft_response([*prompt, 20], 8, [-1.0]),
        ft_response([*prompt, 20, 21, 22], 8, [-1.0, -2.0, -3.0]),  # two tokens in one response
        ft_response([*prompt, 20, 21, 22], 8, [-1.0, -2.0, -3.0]),  # nothing new
        {},  # an empty final response
        ft_response([*prompt, 20, 21, 22, 2], 8, [-1.0, -2.0, -3.0, -4.0]),
    ])}) as triton:
        adapter = FasterTransformer(*await triton.calling("m"), "m")
        adapter.configure(ft_config())
        sampling = Sampling(max_new_tokens=5, greedy=True, logprobs=True, request_id="chatcmpl-1-0")
        steps = [step async for step in adapter.stream(prompt, sampling, None)]
    assert [s.token_ids for s in steps] == [[20], [21, 22], [2]]
    assert [s.logprobs for s in steps] == [[-1.0], [-2.0, -3.0], [-4.0]]
    assert triton.requests[0].request_id == "chatcmpl-1-0"  # Triton's logs name the client request


def test_ft_takes_only_its_beam_widths() -> None:
    adapter = FasterTransformer(None, "u", "m")  # type: ignore[arg-type]
    adapter.configure(ft_config(FT_INPUTS))
    assert adapter.beam_widths == []  # no beam_width input
    adapter.configure(ft_config({**FT_INPUTS, "beam_width": "UINT32"}))
    assert adapter.beam_widths == [2, 3, 4, 8, 16, 32]
    assert adapter.tensors([1], Sampling(max_new_tokens=1, greedy=True, beam_width=4))["beam_width"].tolist() == [[4]]
    limited = {"max_beam_width": {"string_value": "1"}}
    adapter.configure({**ft_config({**FT_INPUTS, "beam_width": "UINT32"}), "parameters": limited})
    assert adapter.beam_widths == []


async def test_ft_beams_are_each_beams_generated_tokens() -> None:
    prompt = [7, 8]
    ids = np.array([[[7, 8, 20, 21, 2], [7, 8, 22, 2, 2]]], dtype=np.uint32)  # padded with the end id
    inputs = {**FT_INPUTS, "beam_width": "UINT32"}
    async with FakeTriton({"m": FakeModel(ft_config(inputs), [
        {"output_ids": ids, "sequence_length": np.array([[4, 3]], dtype=np.uint32)},
    ])}) as triton:
        adapter = FasterTransformer(*await triton.calling("m"), "m")
        adapter.configure(ft_config(inputs))
        steps = [step async for step in adapter.stream(prompt, Sampling(max_new_tokens=3, greedy=True, beam_width=2),
                                                       None)]
    assert [s.beams for s in steps] == [[[20, 21], [22]]]
