"""The TensorRT-LLM (`tensorrt_llm` model) adapter: the tensors it sends (names, types, shapes, the names of
older configs, word lists in TensorRT-LLM's strict layout), refusals, and new-token responses → steps."""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Guide, Sampling
from services.llm.tensorrt_llm import TensorRTLLM
from tests.support.fake_triton import FakeModel, FakeTriton, triton_config

# tensorrtllm_backend's all_models/inflight_batcher_llm/tensorrt_llm (2025-05 names), the inputs the adapter uses.
INPUTS = {"input_ids": "INT32", "input_lengths": "INT32", "request_output_len": "INT32", "end_id": "INT32",
          "pad_id": "INT32", "stop_words_list": "INT32", "bad_words_list": "INT32", "runtime_top_k": "INT32",
          "runtime_top_p": "FP32", "temperature": "FP32", "len_penalty": "FP32", "repetition_penalty": "FP32",
          "min_tokens": "INT32", "presence_penalty": "FP32", "frequency_penalty": "FP32", "seed": "UINT64",
          "return_log_probs": "BOOL", "exclude_input_in_output": "BOOL", "streaming": "BOOL"}
OUTPUTS = {"output_ids": "INT32", "sequence_length": "INT32", "cum_log_probs": "FP32", "output_log_probs": "FP32"}
OLD = {**{k: v for k, v in INPUTS.items() if k not in ("seed", "min_tokens", "exclude_input_in_output")},
       "random_seed": "UINT64", "min_length": "INT32"}  # before 2025-05 (and before 2024-09 for exclude_...)


def adapter(inputs: dict[str, str] = INPUTS, calling: tuple[Any, Any] = (None, None), **config: Any) -> TensorRTLLM:
    """The adapter calling a FakeTriton's model (`FakeTriton.calling`), or none (for what needs no Triton)."""
    trt = TensorRTLLM(*calling, "m", {"len_penalty": 1.0})
    trt.configure(triton_config(inputs, OUTPUTS, **config))
    return trt


def sampling(**fields: Any) -> Sampling:
    return Sampling(**{"max_new_tokens": 7, "greedy": False, "temperature": 0.7, "top_k": 40, "top_p": 0.9,
                       "seed": 2**64 - 1, "end_id": 2, **fields})


def test_tensors_names_types_and_shapes() -> None:
    tensors = adapter().tensors([10, 11, 12], sampling(stop_words=[[13], [14, 15]], bad_words=[[99]],
                                                       presence_penalty=0.5, min_tokens=3, logprobs=True))
    assert tensors["input_ids"].dtype == np.int32 and tensors["input_ids"].tolist() == [[10, 11, 12]]
    assert tensors["input_lengths"].tolist() == [[3]] and tensors["request_output_len"].tolist() == [[7]]
    assert tensors["streaming"].dtype == np.bool_ and tensors["streaming"].tolist() == [[True]]
    assert tensors["exclude_input_in_output"].tolist() == [[True]]
    assert tensors["end_id"].tolist() == [[2]] and tensors["end_id"].dtype == np.int32
    assert tensors["runtime_top_k"].tolist() == [[40]] and tensors["temperature"].dtype == np.float32
    assert tensors["seed"].dtype == np.uint64 and int(tensors["seed"][0, 0]) == 2**64 - 1
    assert tensors["min_tokens"].tolist() == [[3]] and tensors["return_log_probs"].tolist() == [[True]]
    assert tensors["presence_penalty"].tolist() == [[0.5]] and tensors["len_penalty"].tolist() == [[1.0]]
    assert tensors["stop_words_list"].dtype == np.int32
    assert tensors["stop_words_list"].tolist() == [[[13, 14, 15], [1, 3, -1]]]
    assert tensors["bad_words_list"].tolist() == [[[99], [1]]]
    # Defaults stay TensorRT-LLM's own: nothing sent for them.
    assert not {"repetition_penalty", "frequency_penalty", "pad_id", "random_seed"} & tensors.keys()


def test_older_configs_get_their_input_names() -> None:
    tensors = adapter(OLD).tensors([1], sampling(min_tokens=2))
    assert int(tensors["random_seed"][0, 0]) == 2**64 - 1 and tensors["min_length"].tolist() == [[2]]
    assert not {"seed", "min_tokens", "exclude_input_in_output"} & tensors.keys()
    assert adapter(OLD).supports("seed") and adapter(OLD).supports("min_tokens")


def test_greedy_has_no_top_p_and_ignore_eos_no_end_id() -> None:
    tensors = adapter().tensors([1], sampling(greedy=True, top_p=0.0, ignore_eos=True))
    assert tensors["runtime_top_k"].tolist() == [[1]]
    assert not {"runtime_top_p", "temperature", "end_id"} & tensors.keys()  # top_p must be in (0, 1]


def test_empty_word_lists_are_left_out() -> None:
    tensors = adapter().tensors([1], sampling(stop_words=[], bad_words=[[]]))
    assert "stop_words_list" not in tensors and "bad_words_list" not in tensors


def test_knobs_follow_the_declared_inputs() -> None:
    bare = adapter({k: INPUTS[k] for k in ("input_ids", "input_lengths", "request_output_len", "streaming",
                                           "len_penalty")})
    assert not any(bare.supports(knob) for knob in ("presence_penalty", "seed", "min_tokens", "logprobs",
                                                    "bad_words", "logit_bias", "min_p", "top_logprobs"))
    assert bare.supports("ignore_eos") and bare.supports("special_tokens")  # done without inputs
    full = adapter()
    assert all(full.supports(knob) for knob in ("presence_penalty", "frequency_penalty", "logprobs", "logit_bias",
                                                "seed", "top_k", "min_tokens", "repetition_penalty"))


@pytest.mark.parametrize(("inputs", "config", "says"), [
    ({"input_ids": "INT32"}, {}, "lacks the TensorRT-LLM tensors input_lengths, request_output_len, streaming"),
    (INPUTS, {"decoupled": False}, "must be decoupled"),
])
def test_a_model_that_cannot_stream_tokens_is_refused(inputs: dict[str, str], config: dict[str, Any],
                                                      says: str) -> None:
    with pytest.raises(ServiceError) as info:
        adapter(inputs, **config)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and says in info.value.message


def test_constants_must_be_declared() -> None:
    trt = TensorRTLLM(None, None, "m", {"delay_ms": 1})  # type: ignore[arg-type]
    with pytest.raises(ServiceError, match="no input delay_ms"):
        trt.configure(triton_config(INPUTS, OUTPUTS))


def response(tokens: list[int], log_probs: list[float] | None = None, width: int | None = None
             ) -> dict[str, np.ndarray]:
    ids = np.full((1, 1, width or max(len(tokens), 1)), -1, dtype=np.int32)
    ids[0, 0, : len(tokens)] = tokens
    out = {"output_ids": ids, "sequence_length": np.array([[len(tokens)]], dtype=np.int32)}
    if log_probs is not None:
        out["output_log_probs"] = np.array([[log_probs]], dtype=np.float32)
    return out


async def test_each_response_holds_only_new_tokens() -> None:
    async with FakeTriton({"m": FakeModel(triton_config(INPUTS, OUTPUTS), [
        response([20], [-1.0]),
        response([21, 22], [-2.0, -3.0], width=4),  # two tokens (speculative decoding), padded with -1
        {},  # an empty final response
        response([], []),
        response([23], [-1.0, -2.0, -3.0, -4.0]),  # a backend that reports every log probability so far
    ])}) as triton:
        trt = adapter(calling=await triton.calling("m"))
        steps = [step async for step in trt.stream([7, 8, 9], sampling(logprobs=True, request_id="cmpl-1-0"), None)]
    assert [s.token_ids for s in steps] == [[20], [21, 22], [23]]
    assert [s.logprobs for s in steps] == [[-1.0], [-2.0, -3.0], [-4.0]]
    assert all(s.text is None for s in steps)
    request = triton.requests[0]
    assert request.outputs == ["output_ids", "sequence_length", "output_log_probs"]
    assert request.request_id == "cmpl-1-0"


def test_beam_widths_follow_the_max_beam_width_parameter() -> None:
    beams = {**INPUTS, "beam_width": "INT32"}
    assert adapter(beams).beam_widths == []  # TensorRT-LLM's default max_beam_width is 1
    wide = adapter(beams, parameters={"max_beam_width": {"string_value": "4"}})
    assert wide.beam_widths == [2, 3, 4]
    assert adapter(parameters={"max_beam_width": {"string_value": "4"}}).beam_widths == []  # no beam_width input
    assert wide.tensors([1], sampling(beam_width=3))["beam_width"].tolist() == [[3]]
    assert "beam_width" not in wide.tensors([1], sampling())


async def test_beams_are_whole_in_every_response() -> None:
    """Streaming with beams, TensorRT-LLM sends every beam's tokens so far, shorter ones padded with -1."""
    def beams(rows: list[list[int]]) -> dict[str, np.ndarray]:
        ids = np.full((1, len(rows), max(map(len, rows))), -1, dtype=np.int32)
        for k, row in enumerate(rows):
            ids[0, k, : len(row)] = row
        return {"output_ids": ids, "sequence_length": np.array([[len(row) for row in rows]], dtype=np.int32)}

    inputs = {**INPUTS, "beam_width": "INT32"}
    async with FakeTriton({"m": FakeModel(triton_config(inputs, OUTPUTS), [
        beams([[20], [21]]), {}, beams([[20, 22], [21]]),
    ])}) as triton:
        trt = adapter(inputs, calling=await triton.calling("m"), parameters={"max_beam_width": {"string_value": "2"}})
        steps = [step async for step in trt.stream([7, 8], sampling(beam_width=2), None)]
    assert [s.beams for s in steps] == [[[20], [21]], [[20, 22], [21]]]
    assert triton.requests[0].inputs["beam_width"].tolist() == [[2]]


GUIDED = {**INPUTS, "guided_decoding_guide_type": "STRING", "guided_decoding_guide": "STRING"}


@pytest.mark.parametrize(("guide", "guide_type"), [
    (Guide("json_schema", '{"type": "object"}'), b"json_schema"),
    (Guide("grammar", 'root ::= "yes" | "no"'), b"ebnf_grammar"),
    (Guide("regex", "[0-9]+"), b"regex"),
])
def test_each_kind_of_guide_has_its_guide_type(guide: Guide, guide_type: bytes) -> None:
    guided = adapter(GUIDED)
    assert guided.supports("guided_decoding") and not adapter().supports("guided_decoding")
    tensors = guided.tensors([1], sampling(guide=guide))
    assert tensors["guided_decoding_guide_type"].tolist() == [[guide_type]]
    assert tensors["guided_decoding_guide"].tolist() == [[guide.text.encode()]]
    assert "guided_decoding_guide_type" not in guided.tensors([1], sampling())


REUSE = ({**INPUTS, "return_perf_metrics": "BOOL"}, {**OUTPUTS, "kv_cache_reused_blocks": "INT32"})


def reused(tokens: list[int], blocks: int) -> dict[str, np.ndarray]:
    return {**response(tokens), "kv_cache_reused_blocks": np.array([[blocks]], dtype=np.int32)}


async def test_reused_kv_cache_blocks_are_cached_prompt_tokens() -> None:
    """Where the model declares `return_perf_metrics` and `kv_cache_reused_blocks`, each request asks for the
    metrics, and the reused blocks times the engine's tokens per block are the prompt's cached tokens."""
    inputs, outputs = REUSE
    async with FakeTriton({"m": FakeModel(triton_config(inputs, outputs), [
        reused([20], 3), reused([], 3),  # the last response ends at the end id, with no token
    ])}) as triton:
        trt = TensorRTLLM(*await triton.calling("m"), "m", tokens_per_block=16)
        trt.configure(triton_config(inputs, outputs))
        steps = [step async for step in trt.stream([7] * 60, sampling(), None)]
    assert [(s.token_ids, s.cached_tokens) for s in steps] == [([20], 48), ([], 48)]
    request = triton.requests[0]
    assert request.inputs["return_perf_metrics"].tolist() == [[True]] and "kv_cache_reused_blocks" in request.outputs
    # Without the output (the input alone, as the demo models declare it) nothing is asked for.
    assert "return_perf_metrics" not in adapter(inputs).tensors([1], sampling())
    assert "return_perf_metrics" not in adapter().tensors([1], sampling())


LOGITS_INPUTS = {**INPUTS, "return_context_logits": "BOOL", "return_generation_logits": "BOOL"}
LOGITS_OUTPUTS = {**OUTPUTS, "context_logits": "FP32", "generation_logits": "FP32"}


async def test_log_probabilities_from_the_context_and_generation_logits() -> None:
    vocab, prompt = 6, [1, 4, 3]
    context = np.log(np.array([[[0.05, 0.15, 0.1, 0.1, 0.5, 0.1], [0.25, 0.2, 0.15, 0.3, 0.05, 0.05],
                                [0.5, 0.1, 0.1, 0.1, 0.1, 0.1]]], dtype=np.float32))  # [1, prompt, vocab]
    generation = np.log(np.full((1, 1, 1, vocab), 1 / vocab, dtype=np.float32))
    first = {**response([0], [-1.5]), "context_logits": context, "generation_logits": generation}
    empty = {"output_ids": np.zeros((1, 1, 0), dtype=np.int32), "sequence_length": np.array([[0]], dtype=np.int32)}
    async with FakeTriton({"m": FakeModel(triton_config(LOGITS_INPUTS, LOGITS_OUTPUTS), [first, empty])}) as triton:
        trt = TensorRTLLM(*await triton.calling("m"), "m")
        trt.configure(triton_config(LOGITS_INPUTS, LOGITS_OUTPUTS))
        assert trt.supports("prompt_logprobs") and trt.supports("top_logprobs")
        steps = [step async for step in trt.stream(prompt, sampling(logprobs=True, top_logprobs=2,
                                                                     prompt_logprobs=True), None)]
    assert len(steps) == 1 and steps[0].token_ids == [0] and steps[0].logprobs == [-1.5]  # the backend's own
    scored = steps[0].prompt_logprobs
    assert scored is not None and [p.token for p in scored] == prompt and scored[0].logprob is None
    assert [p.logprob for p in scored[1:]] == pytest.approx([np.log(0.5), np.log(0.3)], abs=1e-6)
    assert [t for t, _ in scored[1].top] == [4, 1] and [t for t, _ in scored[2].top] == [3, 0]
    assert steps[0].top_logprobs is not None and len(steps[0].top_logprobs[0]) == 2
    request = triton.requests[0]
    assert request.outputs[-2:] == ["context_logits", "generation_logits"]
    assert request.inputs["return_context_logits"].tolist() == [[True]]


def test_without_the_logits_outputs_there_are_no_prompt_log_probabilities() -> None:
    trt = adapter()
    assert not trt.supports("prompt_logprobs") and not trt.supports("top_logprobs")
