"""The llm service on every backend interface: a real grpc.aio server against the session's real Triton
and its echo models (tests/triton_models: ft-echo, trtllm-echo, trtllm-echo-v0 with the old input names,
trtllm-text-echo like the ensemble, trtllm-bls-echo-accumulate, vllm-echo), whose continuation repeats
the prompt. No model entry names its backend: each is detected from its Triton configuration."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.common.server import RunningService
from tests.support.events import events_offset, read_events
from tests.support.llm_service import llm_service, llm_stub
from tests.support.ports import wait_until
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc
from tritongate.wire import REQUEST_ID_KEY

TOKEN_LEVEL = ["ft-echo", "trtllm-echo", "trtllm-echo-v0"]
TEXT_LEVEL = ["trtllm-text-echo", "trtllm-bls-echo-accumulate", "vllm-echo"]
EVERY = TOKEN_LEVEL + TEXT_LEVEL
WHOLE_CHARACTERS = [m for m in EVERY if m != "trtllm-text-echo"]  # the ensemble decodes tokens one by one


@pytest.fixture(scope="module")
async def service(model_config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningService]:
    folder = tmp_path_factory.mktemp("llm-backends")
    config = json.loads(model_config_file.read_text())  # noqa: ASYNC240 (test set-up)
    echo = next(entry for entry in config["llm"] if entry["name"] == "ft-echo")
    config["llm"] = [echo] + [dict(echo, name=name) for name in EVERY[1:]]
    config["llm"].append(dict(echo, name="vllm-echo-slow", triton_model="vllm-echo", triton_inputs={"delay_ms": 50}))
    config["model_infos"] = [{"name": entry["name"], "max_len": 256} for entry in config["llm"]]
    async with llm_service(config, folder) as running:
        yield running


def completion(model: str, prompt: str, **fields: Any) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(model=model, prompts=llm_pb2.Prompts(prompts=[llm_pb2.Prompt(text=prompt)]),
                                   **fields)


async def generate(stub: llm_pb2_grpc.LlmServiceStub, request: llm_pb2.GenerateRequest, **kwargs: Any
                   ) -> list[llm_pb2.GenerateResponse]:
    return [response async for response in stub.Generate(request, **kwargs)]


def deltas(messages: list[llm_pb2.GenerateResponse], index: int = 0) -> list[llm_pb2.Delta]:
    return [m.delta for m in messages if m.WhichOneof("event") == "delta" and m.delta.index == index]


def text(messages: list[llm_pb2.GenerateResponse], index: int = 0) -> str:
    return "".join(d.text for d in deltas(messages, index))


def reason(messages: list[llm_pb2.GenerateResponse], index: int = 0) -> str:
    return deltas(messages, index)[-1].finish_reason


def ids(tokenizer: Any, value: str) -> list[int]:
    return list(tokenizer.encode(value, add_special_tokens=False))


@pytest.mark.parametrize("model", EVERY)
async def test_every_backend_echoes_with_length_and_usage(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any,
                                                          model: str) -> None:
    prompt = "Hello world, said the echo."
    n = len(ids(tokenizer, prompt))
    messages = await generate(stub, completion(model, prompt, max_tokens=n + 2))
    assert text(messages) == prompt + "Hello world" and reason(messages) == "length"
    assert messages[-1].usage == common_pb2.Usage(prompt_tokens=n, completion_tokens=n + 2, total_tokens=2 * n + 2)


@pytest.mark.parametrize("model", WHOLE_CHARACTERS)
async def test_multi_byte_characters_come_whole(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any,
                                                model: str) -> None:
    prompt = "Hi 😀 and 你好"
    messages = await generate(stub, completion(model, prompt, max_tokens=len(ids(tokenizer, prompt))))
    assert text(messages) == prompt and "\ufffd" not in "".join(d.text for d in deltas(messages))


@pytest.mark.parametrize("model", EVERY)
async def test_stop_strings_and_the_end_id_end_completions(stub: llm_pb2_grpc.LlmServiceStub, model: str) -> None:
    messages = await generate(stub, completion(model, "one two STOP three", max_tokens=20, stop=["STOP"]))
    assert text(messages) == "one two " and reason(messages) == "stop"
    messages = await generate(stub, completion(model, "one two STOP three", max_tokens=20, stop=["STOP"],
                                               include_stop_str_in_output=True))
    assert text(messages) == "one two STOP" and reason(messages) == "stop"
    messages = await generate(stub, completion(model, "a b<|im_end|>c", max_tokens=20))
    assert text(messages) == "a b" and reason(messages) == "stop"


@pytest.mark.parametrize("model", [m for m in EVERY if m != "ft-echo"])
async def test_ignore_eos(stub: llm_pb2_grpc.LlmServiceStub, model: str) -> None:
    messages = await generate(stub, completion(model, "a b<|im_end|>c", max_tokens=6, ignore_eos=True))
    assert text(messages).startswith("a bc") and reason(messages) == "length"
    assert messages[-1].usage.completion_tokens == 6


@pytest.mark.parametrize("model", ["trtllm-echo", "trtllm-echo-v0", "trtllm-text-echo", "vllm-echo"])
async def test_min_tokens_keeps_the_end_id_out(stub: llm_pb2_grpc.LlmServiceStub, model: str) -> None:
    messages = await generate(stub, completion(model, "a b<|im_end|>", max_tokens=6, min_tokens=4))
    assert text(messages) == "a ba b" and reason(messages) == "stop"


@pytest.mark.parametrize(("model", "fields", "param"), [
    ("ft-echo", {"ignore_eos": True}, "ignore_eos"),
    ("ft-echo", {"min_p": 0.1}, "min_p"),
    ("trtllm-echo", {"logprobs": True, "top_logprobs": 2}, "top_logprobs"),
    ("trtllm-text-echo", {"logprobs": True}, "logprobs"),
    ("trtllm-bls-echo-accumulate", {"skip_special_tokens": False}, "skip_special_tokens"),
    ("vllm-echo", {"logit_bias": {5: -100}}, "logit_bias"),
])
async def test_knobs_a_backend_lacks_are_refused(stub: llm_pb2_grpc.LlmServiceStub, model: str,
                                                 fields: dict[str, Any], param: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, completion(model, "x", **fields))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "not supported by the" in str(info.value.details())
    assert ("tg-param", param) in tuple(info.value.trailing_metadata() or ())


@pytest.mark.parametrize(("model", "declares"), [
    ("trtllm-echo-v0", "return_context_logits input and a context_logits output"),
    ("ft-echo", "return_context_logits input and a context_logits output"),
    ("vllm-echo", "return_prompt_logprobs input and a prompt_logprobs output"),
])
async def test_echo_with_logprobs_needs_the_prompt_s_log_probabilities(stub: llm_pb2_grpc.LlmServiceStub, model: str,
                                                                       declares: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, completion(model, "x", logprobs=True, echo=True, max_tokens=0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and declares in str(info.value.details())
    assert ("tg-param", "echo") in tuple(info.value.trailing_metadata() or ())


async def test_an_engine_without_context_logits_is_a_refusal_naming_echo(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    """trtllm-echo declares the context logits, as every TensorRT-LLM model does, and fails as an engine built
    without gather_context_logits."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, completion("trtllm-echo", "x", logprobs=True, echo=True, max_tokens=0))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "need to build engine with gather_context_logits" in str(info.value.details())
    assert ("tg-param", "echo") in tuple(info.value.trailing_metadata() or ())


@pytest.mark.parametrize(("model", "alternatives"), [("trtllm-echo", 0), ("vllm-echo", 2)])
async def test_log_probabilities(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any, model: str,
                                 alternatives: int) -> None:
    prompt = "one two three"
    messages = await generate(stub, completion(model, prompt, max_tokens=3, logprobs=True, top_logprobs=alternatives))
    entries = [e for d in deltas(messages) for e in d.logprobs]
    assert [e.token for e in entries] == [tokenizer.decode([t]) for t in ids(tokenizer, prompt)]
    assert [e.text_offset for e in entries] == [0, 3, 7]
    assert all(len(e.top_logprobs) == alternatives for e in entries)


async def test_the_chat_template_renders_for_a_text_backend(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    request = llm_pb2.GenerateRequest(model="vllm-echo", max_tokens=40, skip_special_tokens=False,
                                      chat=llm_pb2.Chat(messages=[llm_pb2.ChatMessage(role="user", content="Hi")]))
    messages = await generate(stub, request)
    # The echo repeats the rendered prompt (special tokens kept) up to its first <|im_end|>, the end id.
    assert text(messages) == "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    assert reason(messages) == "stop"


async def test_n_choices_on_a_text_backend(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any,
                                           events_file: Path) -> None:
    offset = events_offset(events_file)
    n = len(ids(tokenizer, "tick tock"))
    messages = await generate(stub, completion("trtllm-bls-echo-accumulate", "tick tock", n=2, max_tokens=n),
                              metadata=((REQUEST_ID_KEY, "rid-b"),))
    assert text(messages, 0) == text(messages, 1) == "tick tock" and messages[-1].usage.completion_tokens == 2 * n

    def seen() -> set[str]:
        return {e["request_id"] for e in read_events(events_file, offset)}

    await asyncio.to_thread(wait_until, lambda: {"rid-b-0", "rid-b-1"} <= seen(), 10, "both choices' events")


async def test_a_disconnect_cancels_a_text_backends_request(stub: llm_pb2_grpc.LlmServiceStub,
                                                            events_file: Path) -> None:
    offset = events_offset(events_file)
    call = stub.Generate(completion("vllm-echo-slow", "tick tock", max_tokens=200))
    received = 0
    async for message in call:
        received += message.WhichOneof("event") == "delta"
        if received == 3:
            call.cancel()
            break

    def cancelled() -> list[dict[str, Any]]:
        return [e for e in read_events(events_file, offset) if e["event"] == "cancelled"]

    await asyncio.to_thread(wait_until, lambda: bool(cancelled()), 10, "the model's cancellation")
    assert cancelled()[0]["tokens"] < 20


async def test_a_model_no_adapter_can_drive_is_not_served_and_says_why(
        model_config_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A Triton model whose configuration matches no LLM interface (here the MiniLM embedding model) is
    refused at start-up: the reason, naming what was found, is logged and returned to its requests, and
    the other models are served."""
    config = json.loads(model_config_file.read_text())  # noqa: ASYNC240 (test set-up)
    echo = next(entry for entry in config["llm"] if entry["name"] == "ft-echo")
    config["llm"] = [echo, dict(echo, name="not-an-llm", triton_model="all-minilm-l6-v2")]
    config["model_infos"] = [{"name": entry["name"], "max_len": 256} for entry in config["llm"]]
    with caplog.at_level("ERROR", logger="services"):
        async with llm_service(config, tmp_path) as running, llm_stub(running) as stub:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await generate(stub, completion("not-an-llm", "x"))
            assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            details = str(info.value.details())
            assert "`not-an-llm` cannot be served" in details and "matches none of the LLM interfaces" in details
            assert "input_ids INT64" in details and "attention_mask" in details  # what was found
            assert text(await generate(stub, completion("ft-echo", "still here", max_tokens=2))) == "still here"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any("not-an-llm cannot be served" in e and "matches none of the LLM interfaces" in e for e in errors), errors
