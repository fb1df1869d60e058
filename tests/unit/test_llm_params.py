"""OpenAI parameters → sampling: model_infos defaults, validation naming the parameter, backend knobs."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Knob, Sampling, Step
from services.llm.params import Defaults, check_request, choice_seeds, context_length, max_new_tokens, sampling
from tritongate.config import ModelInfo
from tritongate.llm.v1 import llm_pb2


class Backend:
    name = "fake"

    def __init__(self, *knobs: Knob) -> None:
        self.knobs = set(knobs)

    def configure(self, triton_config: dict[str, Any]) -> None:
        pass

    def supports(self, knob: Knob) -> bool:
        return knob in self.knobs

    async def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None
                     ) -> AsyncGenerator[Step, None]:
        yield Step([])


FT = Backend("presence_penalty", "logprobs", "bad_words", "stop_words", "seed", "top_k", "repetition_penalty")
DEFAULTS = Defaults(max_len=100, end_id=2, start_id=None)


def resolve(backend: Backend = FT, defaults: Defaults = DEFAULTS, **fields: Any) -> tuple[Sampling, list[str]]:
    request = llm_pb2.GenerateRequest(model="m", **fields)
    return sampling(request, defaults, backend, "m", 1000, lambda text: [ord(c) for c in text])


def refused(param: str, **fields: Any) -> str:
    with pytest.raises(ServiceError) as info:
        resolve(**fields)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert info.value.param == param, info.value.message
    return info.value.message


def test_openai_defaults() -> None:
    base, stops = resolve()
    assert (base.temperature, base.top_p, base.top_k, base.repetition_penalty) == (1.0, 1.0, 0, 1.0)
    assert not base.greedy and stops == [] and base.end_id == 2 and base.stop_words == []


def test_model_infos_defaults_apply_unless_the_request_says_otherwise() -> None:
    info = ModelInfo(name="m", end_id=-2, start_id=1, max_len=64, temperature=0.3, top_p=0.8, top_k=5,
                     repetition_penalty=1.2, bad_words=[[7768, 3908], [1, 2]], stop_words=[[2], [2]])

    class Tokenizer:
        eos_token_id = 0

    defaults = Defaults.of(info, Tokenizer(), "/nonexistent")
    assert (defaults.max_len, defaults.end_id, defaults.start_id) == (64, 0, 1)  # -2: the tokenizer's end id
    base, _ = resolve(defaults=defaults)
    assert (base.temperature, base.top_p, base.top_k, base.repetition_penalty) == (0.3, 0.8, 5, 1.2)
    assert base.bad_words == [[7768], [3908]] and base.stop_words == [[2], [2]]
    base, _ = resolve(defaults=defaults, temperature=1.5, top_p=1.0, top_k=0, repetition_penalty=1.0)
    assert (base.temperature, base.top_p, base.top_k, base.repetition_penalty) == (1.5, 1.0, 0, 1.0)


@pytest.mark.parametrize("fields", [{"temperature": 0}, {"top_p": 0}, {"top_k": 1}, {"do_sample": False}])
def test_greedy(fields: dict[str, Any]) -> None:
    assert resolve(**fields)[0].greedy


def test_do_sample_true_keeps_sampling() -> None:
    assert not resolve(do_sample=True, temperature=0.5)[0].greedy


def test_single_token_stop_strings_also_go_to_the_backend() -> None:
    base, stops = resolve(stop=["x", "yz", "x"])
    assert stops == ["x", "yz"] and base.stop_words == [[ord("x")]]
    assert resolve(Backend(), stop=["x"])[0].stop_words == []  # a backend without the input: text only


def test_logit_bias_bans_become_bad_words() -> None:
    base, _ = resolve(logit_bias={5: -100, 6: 0})
    assert base.bad_words == [[5]]


@pytest.mark.parametrize(("param", "fields"), [
    ("temperature", {"temperature": 2.5}),
    ("temperature", {"temperature": float("nan")}),
    ("top_p", {"top_p": 1.5}),
    ("repetition_penalty", {"repetition_penalty": 0}),
    ("repetition_penalty", {"repetition_penalty": float("inf")}),  # e.g. 1e300 sent as float32
    ("presence_penalty", {"presence_penalty": 3}),
    ("stop", {"stop": ["a", "b", "c", "d", "e"]}),
    ("stop", {"stop": [""]}),
    ("logit_bias", {"logit_bias": {5: 50}}),
    ("logit_bias", {"logit_bias": {5: -101}}),
    ("logit_bias", {"logit_bias": {5000: -100}}),
    ("frequency_penalty", {"frequency_penalty": 0.5}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 2}),
    ("echo", {"logprobs": True, "echo": True}),
])
def test_refusals_name_the_parameter(param: str, fields: dict[str, Any]) -> None:
    refused(param, **fields)


def test_knobs_the_backend_lacks_are_refused_only_when_used() -> None:
    bare = Backend()
    base, _ = resolve(bare, presence_penalty=0.0, frequency_penalty=0.0, logprobs=False, repetition_penalty=1.0,
                      top_k=0, logit_bias={3: 0})
    assert base.presence_penalty == 0
    with pytest.raises(ServiceError) as info:
        resolve(bare, presence_penalty=0.5)
    assert "not supported by the fake backend" in info.value.message and info.value.param == "presence_penalty"
    with pytest.raises(ServiceError) as info:
        resolve(bare, logprobs=True)
    assert info.value.param == "logprobs"


def test_max_tokens_and_the_context() -> None:
    chat = llm_pb2.GenerateRequest()
    assert max_new_tokens(chat, 30, 100, "messages") == 70  # the rest of the context
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=70), 30, 100, "prompt") == 70
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=71), 30, 100, "prompt")
    assert info.value.param == "max_tokens" and "101 tokens (30 in the prompt, 71 in the completion)" in \
        info.value.message and info.value.error_code == "context_length_exceeded"
    with pytest.raises(ServiceError) as info:
        max_new_tokens(chat, 100, 100, "messages")
    assert info.value.param == "messages" and "maximum context length is 100 tokens" in info.value.message
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=0), 3, 100, "messages")
    assert info.value.param == "max_tokens"
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=0, echo=True), 3, 100, "prompt") == 0


def test_n_and_seeds() -> None:
    assert check_request(llm_pb2.GenerateRequest(), 1, 64) == 1
    for n, prompts in ((17, 1), (16, 5)):
        with pytest.raises(ServiceError) as info:
            check_request(llm_pb2.GenerateRequest(n=n), prompts, 64)
        assert info.value.param == "n"
    assert choice_seeds(llm_pb2.GenerateRequest(seed=-1), 2) == [2**64 - 1, 0]
    assert len(set(choice_seeds(llm_pb2.GenerateRequest(), 3))) == 3


def test_context_length_from_the_model_folder(tmp_path: Any) -> None:
    (tmp_path / "config.json").write_text('{"max_position_embeddings": 4096}')

    class Tokenizer:
        model_max_length = 10**30

    assert context_length(ModelInfo(name="m"), Tokenizer(), str(tmp_path)) == 4096
    assert context_length(ModelInfo(name="m", max_len=512), Tokenizer(), str(tmp_path)) == 512
    assert context_length(ModelInfo(name="m"), Tokenizer(), str(tmp_path / "none")) == 2048


def test_configured_limits_of_n_and_max_tokens_name_the_limit() -> None:
    assert check_request(llm_pb2.GenerateRequest(n=32), 1, 64, max_n=32) == 32
    with pytest.raises(ServiceError) as info:
        check_request(llm_pb2.GenerateRequest(n=5), 1, 64, max_n=4)
    assert info.value.param == "n" and "between 1 and 4 (max_n); got 5" in info.value.message
    assert max_new_tokens(llm_pb2.GenerateRequest(), 30, 100, "prompt", cap=50) == 50
    assert max_new_tokens(llm_pb2.GenerateRequest(), 80, 100, "prompt", cap=50) == 20
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=50), 30, 100, "prompt", cap=50) == 50
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=51), 30, 100, "prompt", cap=50)
    assert info.value.param == "max_tokens" and "at most 50 tokens" in info.value.message


def test_an_infinite_repetition_penalty_is_refused_as_not_finite() -> None:
    assert "finite number greater than 0; got inf" in refused("repetition_penalty", repetition_penalty=float("inf"))
