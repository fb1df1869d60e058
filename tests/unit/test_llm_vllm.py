"""The vLLM adapter: SamplingParams JSON, the tensors it sends (no batch dimension), the flags it sets
only where declared, text deltas with finish reasons, counts and log probabilities, older backends."""

from __future__ import annotations

import json
from typing import Any

import grpc
import numpy as np
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Guide, Sampling
from services.llm.vllm import Vllm, parse_logprobs, sampling_parameters
from tests.support.fake_triton import Arrays, FakeModel, FakeTriton, triton_config

# What vllm_backend's auto_complete_config declares (r25.x).
INPUTS = {"text_input": "STRING", "image": "STRING", "stream": "BOOL", "sampling_parameters": "STRING",
          "exclude_input_in_output": "BOOL", "return_finish_reason": "BOOL", "return_cumulative_logprob": "BOOL",
          "return_logprobs": "BOOL", "return_num_input_tokens": "BOOL", "return_num_output_tokens": "BOOL"}
OUTPUTS = {"text_output": "STRING", "finish_reason": "STRING", "cumulative_logprob": "FP32", "logprobs": "STRING",
           "num_input_tokens": "UINT32", "num_output_tokens": "UINT32"}
R24_02 = ({"text_input": "STRING", "stream": "BOOL", "sampling_parameters": "STRING"}, {"text_output": "STRING"})


def config(inputs: dict[str, str] = INPUTS, outputs: dict[str, str] = OUTPUTS) -> dict[str, Any]:
    return triton_config(inputs, outputs, batched=False, backend="vllm")


def adapter(inputs: dict[str, str] = INPUTS, outputs: dict[str, str] = OUTPUTS, calling: tuple[Any, Any] = (None, None),
            lora: str | None = None) -> Vllm:
    """The adapter calling a FakeTriton's model (`FakeTriton.calling`), or none (for what needs no Triton)."""
    model = Vllm(*calling, "m", lora_name=lora)
    model.configure(config(inputs, outputs))
    return model


def serving(responses: list[Arrays], inputs: dict[str, str] = INPUTS, outputs: dict[str, str] = OUTPUTS
            ) -> FakeTriton:
    return FakeTriton({"m": FakeModel(config(inputs, outputs), responses)})


def sampling(**fields: Any) -> Sampling:
    return Sampling(**{"max_new_tokens": 7, "greedy": False, "temperature": 0.7, "top_k": 0, "top_p": 0.9,
                       "seed": 5, "end_id": 2, **fields})


def test_sampling_parameters_leave_out_vllm_defaults() -> None:
    assert sampling_parameters(sampling()) == {"max_tokens": 7, "seed": 5, "temperature": 0.7, "top_p": 0.9}
    every = sampling(top_k=40, min_p=0.05, stop=["END", ""], include_stop_str=True, presence_penalty=0.5,
                     frequency_penalty=-0.5, repetition_penalty=1.1, min_tokens=2, ignore_eos=True,
                     skip_special_tokens=False, logprobs=True, top_logprobs=3)
    assert sampling_parameters(every, "sql-lora") == {
        "max_tokens": 7, "seed": 5, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "stop": ["END"],
        "include_stop_str_in_output": True, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.1, "min_tokens": 2, "ignore_eos": True, "skip_special_tokens": False,
        "logprobs": 3, "lora_name": "sql-lora"}
    assert sampling_parameters(sampling(greedy=True, top_k=40))["temperature"] == 0.0
    assert "top_k" not in sampling_parameters(sampling(greedy=True, top_k=40))
    assert sampling_parameters(sampling(logprobs=True))["logprobs"] == 0  # the sampled token's only


def test_tensors_have_no_batch_dimension_and_flags_only_where_declared() -> None:
    tensors = adapter(lora="a").tensors("Hi", sampling(logprobs=True))
    assert tensors["text_input"].tolist() == [b"Hi"] and tensors["stream"].tolist() == [True]
    assert tensors["exclude_input_in_output"].tolist() == [True]
    assert json.loads(tensors["sampling_parameters"][0])["lora_name"] == "a"
    assert {"return_finish_reason", "return_num_input_tokens", "return_num_output_tokens",
            "return_logprobs"} <= tensors.keys()
    assert "return_logprobs" not in adapter().tensors("Hi", sampling())
    old = adapter(*R24_02).tensors("Hi", sampling())
    assert set(old) == {"text_input", "stream", "sampling_parameters"}


def test_knobs() -> None:
    model = adapter()
    assert all(model.supports(k) for k in ("min_p", "min_tokens", "ignore_eos", "special_tokens", "top_logprobs",
                                           "logprobs", "presence_penalty", "frequency_penalty", "top_k", "seed"))
    assert not model.supports("logit_bias") and not model.supports("bad_words")
    assert not adapter(*R24_02).supports("logprobs")


def test_a_model_without_the_vllm_interface_is_refused() -> None:
    with pytest.raises(ServiceError) as info:
        adapter({"text_input": "STRING"}, {"text_output": "STRING"})
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "sampling_parameters" in info.value.message


def vllm_response(text: str, reason: str = "None", tokens: int = 1, logprobs: Any = None) -> dict[str, np.ndarray]:
    out = {"text_output": np.array([text.encode()], dtype=np.object_),
           "finish_reason": np.array([reason.encode()], dtype=np.object_),
           "num_input_tokens": np.array([3], dtype=np.uint32), "num_output_tokens": np.array([tokens], dtype=np.uint32)}
    if logprobs is not None:
        out["logprobs"] = np.array([json.dumps(logprobs).encode()], dtype=np.object_)
    return out


async def test_deltas_finish_reason_and_counts() -> None:
    async with serving([vllm_response("Hel"), vllm_response("lo wor", tokens=2),
                        vllm_response("ld", reason="length")]) as triton:
        steps = [s async for s in adapter(calling=await triton.calling("m")).stream([], sampling(), None, text="Say")]
    assert [(s.text, s.tokens, s.finish_reason, s.prompt_tokens) for s in steps] == [
        ("Hel", 1, None, 3), ("lo wor", 2, None, 3), ("ld", 1, "length", 3)]
    assert triton.requests[0].outputs == ["text_output", "finish_reason", "num_input_tokens", "num_output_tokens"]


async def test_abort_is_an_error() -> None:
    async with serving([vllm_response("x", reason="abort")]) as triton:
        model = adapter(calling=await triton.calling("m"))
        with pytest.raises(ServiceError) as info:
            [s async for s in model.stream([], sampling(), None, text="Say")]
    assert "aborted" in info.value.message


def test_logprobs_sampled_token_first_alternatives_by_rank() -> None:
    raw = json.dumps([
        {"7": {"logprob": -2.5, "rank": 3, "decoded_token": "a"}, "9": {"logprob": -0.1, "rank": 1},
         "8": {"logprob": -1.0, "rank": 2}},
        {"5": {"logprob": -0.2, "rank": 1, "decoded_token": "b"}, "6": {"logprob": -2.0, "rank": 2}},
    ])
    tokens, values, tops = parse_logprobs(raw, 2)
    assert tokens == [7, 5] and values == [-2.5, -0.2]
    assert tops == [[(9, -0.1), (8, -1.0)], [(5, -0.2), (6, -2.0)]]
    assert parse_logprobs("null", 2) == ([], [], [])


async def test_logprobs_reach_the_step() -> None:
    async with serving([vllm_response("ab", tokens=2, logprobs=[{"1": {"logprob": -1.0, "rank": 1}},
                                                                {"2": {"logprob": -2.0, "rank": 1}}])]) as triton:
        model = adapter(calling=await triton.calling("m"))
        [step] = [s async for s in model.stream([], sampling(logprobs=True, top_logprobs=1), None, "x")]
    assert (step.token_ids, step.logprobs, step.top_logprobs) == ([1, 2], [-1.0, -2.0], [[(1, -1.0)], [(2, -2.0)]])
    assert "logprobs" in triton.requests[0].outputs


async def test_backends_before_r24_03_stream_the_prompt_and_all_text_so_far() -> None:
    responses = [{"text_output": np.array([text.encode()], dtype=np.object_)}
                 for text in ("Say: Hel", "Say: Hello \ufffd", "Say: Hello 😀")]
    async with serving(responses, *R24_02) as triton:
        model = adapter(*R24_02, calling=await triton.calling("m"))
        assert [s.text async for s in model.stream([], sampling(), None, text="Say: ")] == ["Hel", "lo ", "😀"]


@pytest.mark.parametrize(("guide", "structured"), [
    (Guide("json_schema", '{"type": "object"}'), {"json": {"type": "object"}}),
    (Guide("grammar", 'root ::= "a" | "\\\\"'), {"grammar": 'root ::= "a" | "\\\\"'}),
    (Guide("regex", '"[0-9]+"'), {"regex": '"[0-9]+"'}),
])
def test_each_kind_of_guide_is_its_structured_outputs_field(guide: Guide, structured: dict[str, Any]) -> None:
    params = sampling_parameters(sampling(guide=guide))
    assert json.loads(params["structured_outputs"]) == structured  # a JSON string, as the backend reads it
    assert "structured_outputs" not in sampling_parameters(sampling())
