"""The echo test models (tests/triton_models) on the session's real Triton, driven as the llm service
drives Triton: tritonclient's aio `stream_infer`, one request per stream. These tests pin each model's
backend interface (tensor names, dtypes, shapes, deltas, the FINAL flag, errors, cancellation), since
the llm service's backend adapters are tested against these models."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support.events import events_offset, read_events
from tests.support.ports import wait_until
from tritongate.triton_local import TritonProcess

THUMBS = "Hello world! 😀 done"  # SmolLM2 spells " 😀" in two tokens, neither a whole character


@dataclass
class Reply:
    """One response of a stream: its outputs and FINAL flag, or its error."""

    outputs: dict[str, np.ndarray]
    final: bool
    error: str | None = None

    def text(self, name: str = "text_output") -> list[str]:
        return [v.decode() for v in self.outputs[name].reshape(-1)]


@pytest.fixture(scope="module")
async def grpc_client(triton: TritonProcess) -> AsyncIterator[InferenceServerClient]:
    client = InferenceServerClient(triton.grpc_url)
    yield client
    await client.close()


def tensor(name: str, value: Any, dtype: Any = None) -> InferInput:
    array = np.array(value, dtype=dtype if dtype is not None else np.object_)
    if array.dtype == np.object_:
        array = np.vectorize(lambda v: v.encode() if isinstance(v, str) else v, otypes=[np.object_])(array)
    result = InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    result.set_data_from_numpy(array)
    return result


def request(model: str, inputs: dict[str, Any], outputs: list[str] | None = None, request_id: str = "") -> Any:
    """The request iterator for `stream_infer`: one request, then the stream half-closes."""

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": model, "request_id": request_id or uuid.uuid4().hex,
               "inputs": [tensor(name, *(v if isinstance(v, tuple) else (v,))) for name, v in inputs.items()],
               **({"outputs": [InferRequestedOutput(o) for o in outputs]} if outputs else {})}

    return requests()


async def stream(client: InferenceServerClient, model: str, inputs: dict[str, Any], outputs: list[str] | None = None,
                 request_id: str = "") -> list[Reply]:
    replies = []
    async for result, error in client.stream_infer(request(model, inputs, outputs, request_id)):
        if error is not None:
            replies.append(Reply({}, False, error.message()))
            continue
        response = result.get_response()
        replies.append(Reply({o.name: result.as_numpy(o.name) for o in response.outputs},
                             response.parameters["triton_final_response"].bool_param))
    return replies


def ids_of(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


# Inputs in each interface's layout (batch dim of one where the model has max_batch_size 1).
def i32(v: int) -> tuple[Any, Any]:
    return [[v]], np.int32


def u32(v: int) -> tuple[Any, Any]:
    return [[v]], np.uint32


def flag(v: bool) -> tuple[Any, Any]:
    return [[v]], np.bool_


def trtllm(prompt: list[int], max_new: int, **extra: Any) -> dict[str, Any]:
    return {"input_ids": ([prompt], np.int32), "input_lengths": i32(len(prompt)), "request_output_len": i32(max_new),
            **extra}


def text(prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"text_input": [[prompt]], "max_tokens": i32(max_tokens), **extra}


def vllm(prompt: str, stream: bool = True, **params: Any) -> dict[str, Any]:
    return {"text_input": [prompt], "stream": ([stream], np.bool_), "sampling_parameters": [json.dumps(params)]}


def vllm_returns(*names: str) -> dict[str, Any]:
    return {f"return_{n}": ([True], np.bool_) for n in names}


# -- trtllm-echo / trtllm-echo-v0: the C++ tensorrt_llm model -----------------------------------------


async def test_trtllm_streams_only_new_tokens(grpc_client: InferenceServerClient) -> None:
    replies = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 7], 5, streaming=flag(True),
                                                            tokens_per_response=u32(2)))
    assert [r.outputs["output_ids"].tolist() for r in replies] == [[[[5, 6]]], [[[7, 5]]], [[[6]]]]
    assert [r.outputs["sequence_length"].tolist() for r in replies] == [[[2]], [[2]], [[1]]]
    assert all(r.outputs["output_ids"].dtype == np.int32 for r in replies)
    assert [r.final for r in replies] == [False, False, True]  # FINAL rides on the last data response


async def test_trtllm_non_streaming_returns_the_prompt_unless_excluded(grpc_client: InferenceServerClient) -> None:
    counts = {"return_num_input_tokens": flag(True), "return_num_output_tokens": flag(True),
              "return_log_probs": flag(True)}
    (whole,) = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 7], 4, **counts))
    assert whole.final and whole.outputs["output_ids"].tolist() == [[[5, 6, 7, 5, 6, 7, 5]]]
    assert whole.outputs["num_input_tokens"].tolist() == [[3]]
    assert whole.outputs["num_output_tokens"].tolist() == [[7]]  # it counts output_ids, the prompt too
    assert np.allclose(whole.outputs["output_log_probs"], [[[-0.1, -0.2, -0.3, -0.4]]])
    assert np.allclose(whole.outputs["cum_log_probs"], [[-1.0]])
    (only,) = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 7], 4, exclude_input_in_output=flag(True),
                                                              **counts))
    assert only.outputs["output_ids"].tolist() == [[[5, 6, 7, 5]]]
    assert only.outputs["num_output_tokens"].tolist() == [[4]]


async def test_trtllm_log_probs_grow_while_ids_are_deltas(grpc_client: InferenceServerClient) -> None:
    replies = await stream(grpc_client, "trtllm-echo", trtllm([5, 6], 3, streaming=flag(True),
                                                            return_log_probs=flag(True)))
    assert [r.outputs["output_log_probs"].shape for r in replies] == [(1, 1, 1), (1, 1, 2), (1, 1, 3)]


async def test_trtllm_end_id(grpc_client: InferenceServerClient) -> None:
    """No end_id: -1, no stop at the end token. With it: the end token ends generation and is not returned,
    so a streamed request can end with an empty response; min_tokens keeps the end token out until then."""
    prompt = [5, 6, 2]
    (no_end,) = await stream(grpc_client, "trtllm-echo", trtllm(prompt, 5, exclude_input_in_output=flag(True)))
    assert no_end.outputs["output_ids"].tolist() == [[[5, 6, 2, 5, 6]]]
    replies = await stream(grpc_client, "trtllm-echo", trtllm(prompt, 5, end_id=i32(2), streaming=flag(True)))
    assert [r.outputs["output_ids"].reshape(-1).tolist() for r in replies] == [[5], [6], []]
    assert replies[-1].final and replies[-1].outputs["sequence_length"].tolist() == [[0]]
    (late,) = await stream(grpc_client, "trtllm-echo", trtllm(prompt, 9, end_id=i32(2), min_tokens=i32(3),
                                                              exclude_input_in_output=flag(True)))
    assert late.outputs["output_ids"].tolist() == [[[5, 6, 5, 6]]]  # the first 2 skipped, the next one ends it


async def test_trtllm_stop_words_stay_in_the_output(grpc_client: InferenceServerClient) -> None:
    words = ([[[9, 6, 7], [1, 3, -1]]], np.int32)  # words [9] and [6, 7]
    replies = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 7, 8], 9, stop_words_list=words,
                                                            streaming=flag(True)))
    assert [r.outputs["output_ids"].reshape(-1).tolist() for r in replies] == [[5], [6], [7]]
    bad = ([[[6, 0], [1, -1]]], np.int32)  # never generate 6
    (banned,) = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 7], 4, bad_words_list=bad,
                                                               exclude_input_in_output=flag(True)))
    assert banned.outputs["output_ids"].tolist() == [[[5, 7, 5, 7]]]


@pytest.mark.parametrize(("inputs", "outputs", "says"), [
    (trtllm([5], 2, stop_words_list=([[[5, 6], [3, -1]]], np.int32)), None, "out-of-bound offsets: 5 6 3 -1"),
    (trtllm([5], 2, stop_words_list=([[[5, 6], [2, 1]]], np.int32)), None, "non-increasing offsets"),
    (trtllm([5], 2, bad_words_list=([[[5, 6, 7], [1, -1, 3]]], np.int32)), None, "additional -1s"),
    (trtllm([5], 0), None, "Assertion failed: mMaxNewTokens > 0"),
    (trtllm([5], 2, end_id=i32(49152)), None, "EndId (49152) is not within acceptable range [-1, 49152)"),
    (trtllm([5], 2), ["output_ids"], "sequence_length tensor must be present in list of output tensors"),
])
async def test_trtllm_refusals_are_error_responses(grpc_client: InferenceServerClient, inputs: dict[str, Any],
                                                   outputs: list[str] | None, says: str) -> None:
    (reply,) = await stream(grpc_client, "trtllm-echo", inputs, outputs)
    assert reply.error is not None and says in reply.error


async def test_trtllm_v0_has_the_old_names(grpc_client: InferenceServerClient) -> None:
    config = (await grpc_client.get_model_config("trtllm-echo-v0", as_json=True))["config"]
    names = {spec["name"] for spec in config["input"]}
    assert {"random_seed", "min_length"} <= names
    assert not names & {"seed", "min_tokens", "exclude_input_in_output", "return_num_input_tokens"}
    (reply,) = await stream(grpc_client, "trtllm-echo-v0", trtllm([5, 2], 3, end_id=i32(2), min_length=i32(2),
                                                                 random_seed=([[7]], np.uint64)))
    assert reply.outputs["output_ids"].tolist() == [[[5, 2, 5, 5]]]  # prompt included: the model parameter's default
    (refused,) = await stream(grpc_client, "trtllm-echo-v0", trtllm([5], 1, min_tokens=i32(1)))
    assert refused.error is not None and "unexpected inference input 'min_tokens'" in refused.error


async def test_trtllm_beams_stream_whole_beams(grpc_client: InferenceServerClient) -> None:
    """Beam k echoes from prompt token k, best first; streaming with beams, every response holds each beam's
    tokens so far (TensorRT-LLM's returnAllGeneratedTokens); an end token shortens its beam (-1 padding)."""
    replies = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 2], 3, beam_width=i32(3), end_id=i32(2),
                                                            streaming=flag(True)))
    assert [r.outputs["output_ids"].tolist() for r in replies] == [
        [[[5], [6], [-1]]], [[[5, 6], [6, -1], [-1, -1]]], [[[5, 6], [6, -1], [-1, -1]]]]
    assert replies[-1].final and replies[-1].outputs["sequence_length"].tolist() == [[2, 1, 0]]
    (whole,) = await stream(grpc_client, "trtllm-echo", trtllm([5, 6, 7], 2, beam_width=i32(2),
                                                               return_log_probs=flag(True)))
    assert whole.outputs["output_ids"].tolist() == [[[5, 6, 7, 5, 6], [5, 6, 7, 6, 7]]]  # the prompt per beam
    cumulative = whole.outputs["cum_log_probs"].reshape(-1).tolist()
    assert cumulative == sorted(cumulative, reverse=True) and len(set(cumulative)) == 2  # best first
    (wide,) = await stream(grpc_client, "trtllm-echo", trtllm([5], 2, beam_width=i32(5)))
    assert wide.error is not None and "max_beam_width (4)" in wide.error


async def test_ft_beams_hold_the_prompt_and_fall_back_to_one_beam(grpc_client: InferenceServerClient) -> None:
    ft = {"input_ids": ([[5, 6, 7]], np.uint32), "input_lengths": u32(3), "request_output_len": u32(2),
          "is_return_log_probs": flag(True)}
    replies = await stream(grpc_client, "ft-echo", {**ft, "beam_width": u32(3)})
    last = replies[-1]
    assert last.final and last.outputs["output_ids"].tolist() == [[[5, 6, 7, 5, 6], [5, 6, 7, 6, 7], [5, 6, 7, 7, 5]]]
    assert last.outputs["sequence_length"].tolist() == [[5, 5, 5]]
    cumulative = last.outputs["cum_log_probs"].reshape(-1).tolist()
    assert cumulative == sorted(cumulative, reverse=True)
    (*_, five) = await stream(grpc_client, "ft-echo", {**ft, "beam_width": u32(5)})  # not an FT width: 1 beam
    assert five.outputs["output_ids"].shape == (1, 1, 5)


# -- trtllm-text-echo / trtllm-bls-echo-accumulate: the ensemble / BLS text interface ------------------


async def test_text_streams_per_response_decodes(grpc_client: InferenceServerClient) -> None:
    replies = await stream(grpc_client, "trtllm-text-echo", text(THUMBS, 7, stream=flag(True),
                                                               return_num_output_tokens=flag(True)))
    assert [r.text()[0] for r in replies] == ["Hello", " world", "!", " \ufffd", "\ufffd", " done", "Hello"]
    assert [r.outputs["num_output_tokens"].tolist() for r in replies] == [[[1]]] * 7
    assert not any(r.final for r in replies)  # FINAL comes apart, as a flags-only response the client never sees


async def test_bls_accumulate_streams_cumulative_text(grpc_client: InferenceServerClient) -> None:
    config = (await grpc_client.get_model_config("trtllm-bls-echo-accumulate", as_json=True))["config"]
    assert config["parameters"]["accumulate_tokens"]["string_value"] == "true"
    replies = await stream(grpc_client, "trtllm-bls-echo-accumulate", text(THUMBS, 6, stream=flag(True),
                                                                         tokens_per_response=u32(2)))
    # A character split between responses shows as U+FFFD until the rest of it arrives.
    assert [r.text()[0] for r in replies] == ["Hello world", "Hello world! \ufffd", "Hello world! 😀 done"]


async def test_text_non_streaming_stops_at_the_tokenizers_end_and_at_stop_words(
        grpc_client: InferenceServerClient, tokenizer: Any) -> None:
    counts = {"return_num_input_tokens": flag(True), "return_num_output_tokens": flag(True)}
    (reply,) = await stream(grpc_client, "trtllm-text-echo", text("Hi there<|im_end|>", 20, **counts))
    assert reply.text() == ["Hi thereHi there"]  # prompt + echo; <|im_end|> (end_id by default) not shown
    prompt_tokens = len(ids_of(tokenizer, "Hi there<|im_end|>"))
    assert reply.outputs["num_input_tokens"].tolist() == [[prompt_tokens]]
    assert reply.outputs["num_output_tokens"].tolist() == [[prompt_tokens + 2]]
    (cut,) = await stream(grpc_client, "trtllm-text-echo", text(
        "a bad start, the end", 20, exclude_input_in_output=flag(True), stop_words=[[" the end"]],
        bad_words=[[" bad", ""]]))
    assert cut.text() == ["a start, the end"]  # the stop word stays; " bad" is never generated


async def test_text_refuses_max_tokens_0(grpc_client: InferenceServerClient) -> None:
    (reply,) = await stream(grpc_client, "trtllm-text-echo", text("x", 0))
    assert reply.error is not None and "max_tokens must be a single value > 0" in reply.error


# -- vllm-echo: the vLLM backend -----------------------------------------------------------------------


async def test_vllm_streams_deltas_and_holds_back_split_characters(grpc_client: InferenceServerClient,
                                                                    tokenizer: Any) -> None:
    inputs = vllm(THUMBS, max_tokens=7) | vllm_returns("finish_reason", "num_input_tokens", "num_output_tokens")
    replies = await stream(grpc_client, "vllm-echo", inputs)
    assert [r.text()[0] for r in replies] == ["Hello", " world", "!", "", " 😀", " done", "Hello"]
    assert [r.text("finish_reason")[0] for r in replies] == ["None"] * 6 + ["length"]
    assert [r.outputs["num_output_tokens"].tolist() for r in replies] == [[1]] * 7
    assert replies[0].outputs["num_input_tokens"].shape == () and int(replies[0].outputs["num_input_tokens"]) == len(
        ids_of(tokenizer, THUMBS))
    assert [r.final for r in replies] == [False] * 6 + [True]


async def test_vllm_non_streaming_prepends_the_prompt_per_sequence(grpc_client: InferenceServerClient) -> None:
    inputs = vllm("one two three", stream=False, max_tokens="2", n=2, logprobs=2) | vllm_returns(
        "logprobs", "cumulative_logprob", "finish_reason")
    (reply,) = await stream(grpc_client, "vllm-echo", inputs)
    assert reply.final and reply.text() == ["one two threeone two", "one two three two three"]
    assert reply.text("finish_reason") == ["length", "length"]
    assert np.allclose(reply.outputs["cumulative_logprob"], [-0.3, -0.3])
    first = json.loads(reply.text("logprobs")[0])
    assert len(first) == 2 and [sorted(v["rank"] for v in position.values()) for position in first] == [[1, 2]] * 2
    sampled = next(v for v in first[1].values() if v["rank"] == 1)
    assert sampled["decoded_token"] == " two" and round(sampled["logprob"], 3) == -0.2
    (excluded,) = await stream(grpc_client, "vllm-echo", vllm("one two", stream=False, max_tokens=1)
                               | {"exclude_input_in_output": ([True], np.bool_)})
    assert excluded.text() == ["one"]


async def test_vllm_stop_strings(grpc_client: InferenceServerClient) -> None:
    """The stop string is cut (kept with include_stop_str_in_output); while streaming, text that might
    still turn out to start a stop string is held back until it cannot."""
    replies = await stream(grpc_client, "vllm-echo", vllm("a bad start, the end", max_tokens=20, stop=[" the end"])
                           | vllm_returns("finish_reason"))
    assert "".join(r.text()[0] for r in replies) == "a bad start,"
    assert replies[0].text() == [""] and replies[-1].text("finish_reason") == ["stop"]
    (kept,) = await stream(grpc_client, "vllm-echo", vllm("a bad start, the end", stream=False, max_tokens=20,
                                                          stop="start", include_stop_str_in_output=True))
    assert kept.text() == ["a bad start, the enda bad start"]


async def test_vllm_end_of_sequence_min_tokens_and_string_values(grpc_client: InferenceServerClient) -> None:
    replies = await stream(grpc_client, "vllm-echo", vllm("Hi<|im_end|>", max_tokens=9)
                           | vllm_returns("finish_reason", "num_output_tokens"))
    assert [r.text()[0] for r in replies] == ["Hi", ""]  # the EOS counts as a token, shows no text
    assert replies[-1].text("finish_reason") == ["stop"] and replies[-1].outputs["num_output_tokens"].tolist() == [1]
    replies = await stream(grpc_client, "vllm-echo", vllm("Hi<|im_end|>", max_tokens="4", min_tokens="2")
                           | vllm_returns("finish_reason"))
    assert "".join(r.text()[0] for r in replies) == "HiHi" and replies[-1].text("finish_reason") == ["stop"]
    replies = await stream(grpc_client, "vllm-echo", vllm("Hi<|im_end|>", max_tokens=4, ignore_eos="true"))
    assert "".join(r.text()[0] for r in replies) == "HiHi"  # 4 tokens, 2 of them EOS without text


@pytest.mark.parametrize(("inputs", "says"), [
    (vllm("x", max_tokens=0), "max_tokens must be at least 1, got 0."),
    (vllm("x", temprature=1), "Unexpected keyword argument 'temprature'"),
    (vllm("x", logprobs=21), "greater than max allowed: 20"),
    (vllm("x") | {"exclude_input_in_output": ([False], np.bool_)}, "`exclude_input_in_output` = False is not allowed"),
])
async def test_vllm_refusals_are_error_responses(grpc_client: InferenceServerClient, inputs: dict[str, Any],
                                                 says: str) -> None:
    (reply,) = await stream(grpc_client, "vllm-echo", inputs)
    assert reply.error is not None and reply.error.startswith("Error generating stream: ") and says in reply.error


# -- all models: test knobs, errors mid-stream, cancellation, events ----------------------------------

STREAMING = {
    "ft-echo": lambda n: {"input_ids": ([[5, 6, 7]], np.uint32), "input_lengths": u32(3),
                          "request_output_len": u32(n)},
    "trtllm-echo": lambda n: trtllm([5, 6, 7], n, streaming=flag(True)),
    "trtllm-echo-v0": lambda n: trtllm([5, 6, 7], n, streaming=flag(True)),
    "trtllm-text-echo": lambda n: text("one two three", n, stream=flag(True)),
    "trtllm-bls-echo-accumulate": lambda n: text("one two three", n, stream=flag(True)),
    "vllm-echo": lambda n: vllm("one two three", max_tokens=n),
}


def knob(model: str, value: int) -> tuple[Any, Any]:
    return ([value], np.uint32) if model == "vllm-echo" else u32(value)


@pytest.mark.parametrize("model", STREAMING)
async def test_an_injected_error_ends_the_stream_mid_way(grpc_client: InferenceServerClient, model: str,
                                                         events_file: Path) -> None:
    offset, request_id = events_offset(events_file), uuid.uuid4().hex
    replies = await stream(grpc_client, model, STREAMING[model](10) | {"error_after_tokens": knob(model, 2)},
                           request_id=request_id)
    assert [r.error is None for r in replies] == [True, True, False]
    assert replies[-1].error is not None and f"{model}: injected error after 2 tokens" in replies[-1].error
    assert {"event": "error", "model": model, "request_id": request_id, "tokens": 2} in read_events(events_file, offset)


@pytest.mark.parametrize("model", STREAMING)
async def test_completion_is_reported_with_the_triton_request_id(grpc_client: InferenceServerClient, model: str,
                                                                 events_file: Path) -> None:
    offset, request_id = events_offset(events_file), uuid.uuid4().hex
    await stream(grpc_client, model, STREAMING[model](3) | {"tokens_per_response": knob(model, 3)},
                 request_id=request_id)
    (done,) = [e for e in read_events(events_file, offset) if e["request_id"] == request_id]
    assert done["event"] == "completed" and done["model"] == model and done["tokens"] == 3


@pytest.mark.parametrize("model", STREAMING)
async def test_cancelling_the_stream_cancels_the_request(grpc_client: InferenceServerClient, model: str,
                                                         events_file: Path) -> None:
    offset, request_id = events_offset(events_file), uuid.uuid4().hex
    call = grpc_client.stream_infer(request(model, STREAMING[model](500) | {"delay_ms": knob(model, 20)},
                                            request_id=request_id))
    received = 0
    async for _result, error in call:
        assert error is None
        received += 1
        if received == 2:
            call.cancel()
            break

    def cancelled() -> list[dict[str, Any]]:
        return [e for e in read_events(events_file, offset) if e["request_id"] == request_id]

    await asyncio.to_thread(wait_until, cancelled, 10, f"{model}'s cancellation")
    (seen,) = cancelled()
    assert seen["event"] == "cancelled" and seen["model"] == model and seen["tokens"] < 20


async def test_decoupled_models_refuse_unary_infer(grpc_client: InferenceServerClient) -> None:
    """Every echo model is decoupled, as the real ones are when they stream: only ModelStreamInfer works."""
    with pytest.raises(InferenceServerException, match="decoupled"):
        await grpc_client.infer("trtllm-echo", [tensor(n, *v) for n, v in trtllm([5], 1).items()])
