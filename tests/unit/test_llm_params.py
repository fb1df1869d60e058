"""OpenAI parameters → sampling under a model's GenerationPolicy: model_infos defaults, the model's limits,
validation naming the parameter, backend knobs."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import replace
from typing import Any

import grpc
import pytest

from services.common.errors import ServiceError
from services.llm.backends import Guide, Knob, Sampling, Step
from services.llm.params import (
    Defaults,
    GenerationPolicy,
    check_request,
    choice_seeds,
    context_length,
    for_choice,
    max_new_tokens,
    sampling,
)
from tritongate.config import LlmModel, ModelInfo
from tritongate.llm.v1 import llm_pb2
from tritongate.logs import NO_REQUEST


class Backend:
    name = "fake"

    def __init__(self, *knobs: Knob, takes_text: bool = False, beam_widths: Sequence[int] = ()) -> None:
        self.knobs = set(knobs)
        self.takes_text = takes_text
        self.beam_widths = beam_widths

    def configure(self, triton_config: dict[str, Any]) -> None:
        pass

    def supports(self, knob: Knob) -> bool:
        return knob in self.knobs

    async def stream(self, prompt: Sequence[int], sampling: Sampling, timeout: float | None, text: str = ""
                     ) -> AsyncGenerator[Step, None]:
        yield Step([])


FT = Backend("presence_penalty", "logprobs", "bad_words", "logit_bias", "stop_words", "seed", "top_k",
             "repetition_penalty", "special_tokens")
POLICY = GenerationPolicy(model="m", defaults=Defaults(end_id=2), backend=FT, vocab_size=1000,
                          tokenize=lambda text: [ord(c) for c in text],
                          detokenize=lambda ids: "".join(map(chr, ids)), context_length=100, max_n=16,
                          max_choices=64, max_completion_tokens=None)


def policy(**fields: Any) -> GenerationPolicy:
    return replace(POLICY, **fields)


def resolve(backend: Backend = FT, defaults: Defaults = POLICY.defaults, **fields: Any) -> tuple[Sampling, list[str]]:
    request = llm_pb2.GenerateRequest(model="m", **fields)
    return sampling(request, policy(backend=backend, defaults=defaults))


def refused(param: str, backend: Backend = FT, **fields: Any) -> str:
    with pytest.raises(ServiceError) as info:
        resolve(backend, **fields)
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

    defaults = Defaults.of(info, Tokenizer())
    assert (defaults.end_id, defaults.start_id) == (0, 1)  # -2: the tokenizer's end id
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
    assert max_new_tokens(chat, POLICY, 30, "messages") == 70  # the rest of the context
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=70), POLICY, 30, "prompt") == 70
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=71), POLICY, 30, "prompt")
    assert info.value.param == "max_tokens" and "101 tokens (30 in the prompt, 71 in the completion)" in \
        info.value.message and info.value.error_code == "context_length_exceeded"
    with pytest.raises(ServiceError) as info:
        max_new_tokens(chat, POLICY, 100, "messages")
    assert info.value.param == "messages" and "maximum context length is 100 tokens" in info.value.message
    # Whether 0 is allowed (only with `echo`) is the edge's rule; here it generates nothing.
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=0, echo=True), POLICY, 3, "prompt") == 0
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=0), POLICY, 3, "messages") == 0


def test_n_and_seeds() -> None:
    assert check_request(llm_pb2.GenerateRequest(), POLICY, 1) == 1
    for n, prompts in ((17, 1), (16, 5)):
        with pytest.raises(ServiceError) as info:
            check_request(llm_pb2.GenerateRequest(n=n), POLICY, prompts)
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
    assert check_request(llm_pb2.GenerateRequest(n=32), policy(max_n=32), 1) == 32
    with pytest.raises(ServiceError) as info:
        check_request(llm_pb2.GenerateRequest(n=5), policy(max_n=4), 1)
    assert info.value.param == "n" and "between 1 and 4 (max_n); got 5" in info.value.message
    capped = policy(max_completion_tokens=50)
    assert max_new_tokens(llm_pb2.GenerateRequest(), capped, 30, "prompt") == 50
    assert max_new_tokens(llm_pb2.GenerateRequest(), capped, 80, "prompt") == 20
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=50), capped, 30, "prompt") == 50
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=51), capped, 30, "prompt")
    assert info.value.param == "max_tokens" and "at most 50 tokens" in info.value.message


def test_a_default_max_tokens_caps_a_request_that_sets_none_but_may_be_exceeded() -> None:
    defaulted = policy(defaults=Defaults(end_id=2, max_new_tokens=10))
    assert max_new_tokens(llm_pb2.GenerateRequest(), defaulted, 30, "messages") == 10
    assert max_new_tokens(llm_pb2.GenerateRequest(), defaulted, 95, "messages") == 5  # the rest of the context
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=60), defaulted, 30, "prompt") == 60  # asked for more
    assert max_new_tokens(llm_pb2.GenerateRequest(min_tokens=12), defaulted, 30, "prompt") == 12
    # Under the model's limit, the smaller of the two wins.
    assert max_new_tokens(llm_pb2.GenerateRequest(), replace(defaulted, max_completion_tokens=8), 30, "prompt") == 8
    # A completion of prompts: 16, as OpenAI's completions API, or the model's default where it is smaller.
    prompts = llm_pb2.GenerateRequest(prompts=llm_pb2.Prompts(prompts=[llm_pb2.Prompt(text="x")]))
    assert max_new_tokens(prompts, defaulted, 30, "prompt") == 10
    assert max_new_tokens(prompts, replace(defaulted, defaults=Defaults(end_id=2, max_new_tokens=256)), 30,
                          "prompt") == 16
    assert max_new_tokens(prompts, policy(defaults=Defaults(end_id=2)), 30, "prompt") == 16  # no model default
    assert max_new_tokens(prompts, policy(defaults=Defaults(end_id=2)), 90, "prompt") == 10  # the rest of the context


def test_the_policy_is_read_from_the_model_configuration(tmp_path: Any) -> None:
    class Tokenizer:
        eos_token_id = 7
        model_max_length = 512

        def __len__(self) -> int:
            return 300

        def encode(self, text: str, add_special_tokens: bool) -> list[int]:
            return [1, *map(ord, text)] if add_special_tokens else list(map(ord, text))

    entry = LlmModel(name="m", url="u", path=str(tmp_path), max_n=4, max_completion_tokens=30)
    built = GenerationPolicy.of(entry, ModelInfo(name="m", stop_words=[[5]], max_completion_tokens=20), Tokenizer(),
                                FT)
    assert (built.model, built.vocab_size, built.context_length) == ("m", 300, 512)
    assert (built.max_n, built.max_choices, built.max_completion_tokens) == (4, 64, 30)
    assert built.defaults == Defaults(end_id=7, stop_words=[[5]], max_new_tokens=20)
    assert built.tokenize("ab") == [97, 98]  # stop strings: no special tokens


def test_each_choice_names_the_request_and_its_index_in_triton() -> None:
    base, _ = resolve()
    choice = for_choice(base, 10, 42, "req-1", 3)
    assert (choice.max_new_tokens, choice.seed, choice.request_id) == (10, 42, "req-1-3")
    assert for_choice(base, 10, 42, NO_REQUEST, 0).request_id == ""


@pytest.mark.parametrize(("param", "fields"), [
    ("min_p", {"min_p": 0.1}), ("min_tokens", {"min_tokens": 2}), ("ignore_eos", {"ignore_eos": True}),
    ("skip_special_tokens", {"skip_special_tokens": False}), ("top_logprobs", {"logprobs": True, "top_logprobs": 1}),
])
def test_vllm_extensions_a_backend_lacks_are_refused_not_dropped(param: str, fields: dict[str, Any]) -> None:
    assert "not supported by the fake backend" in refused(param, Backend("logprobs"), **fields)


def test_vllm_extensions_at_their_defaults_pass() -> None:
    resolve(Backend(), min_p=0.0, min_tokens=0, ignore_eos=False, include_stop_str_in_output=False,
            skip_special_tokens=True)


def test_vllm_extensions_reach_the_sampling_where_the_backend_has_them() -> None:
    every = Backend("min_p", "min_tokens", "ignore_eos", "special_tokens", "logprobs", "top_logprobs", "stop_words")
    base, _ = resolve(every, min_p=0.05, min_tokens=3, ignore_eos=True, include_stop_str_in_output=True,
                      skip_special_tokens=False, logprobs=True, top_logprobs=4, stop=["x"])
    assert (base.min_p, base.min_tokens, base.ignore_eos) == (pytest.approx(0.05), 3, True)
    assert (base.include_stop_str, base.skip_special_tokens, base.top_logprobs) == (True, False, 4)
    assert base.stop_words == []  # with min_tokens the service alone matches stops
    # include_stop_str_in_output is the service's own: every backend has it.
    assert resolve(Backend(), include_stop_str_in_output=True)[0].include_stop_str


def test_min_tokens_cannot_exceed_the_completion() -> None:
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=5, min_tokens=5), POLICY, 3, "prompt") == 5
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=5, min_tokens=6), POLICY, 3, "prompt")
    assert info.value.param == "min_tokens"
    with pytest.raises(ServiceError) as info:
        max_new_tokens(llm_pb2.GenerateRequest(min_tokens=98), POLICY, 3, "prompt")  # 97 left in the context
    assert info.value.param == "min_tokens"


def test_text_backends_get_stop_strings_and_model_infos_words_as_text() -> None:
    text = Backend("stop_words", "bad_words", takes_text=True)
    defaults = Defaults(end_id=2, stop_words=[[ord("#"), ord("#")]], bad_words=[[ord("!")]])
    base, stops = resolve(text, defaults=defaults, stop=["END"])
    assert stops == ["END", "##"] and base.stop == ["END", "##"] and base.bad == ["!"]
    assert base.stop_words == [[ord("#"), ord("#")]]  # token words stay (a text adapter ignores them)
    with pytest.raises(ServiceError) as info:
        resolve(text, logit_bias={5: -100})  # a ban of a token id needs token ids
    assert info.value.param == "logit_bias"
    token_level, token_stops = resolve(defaults=defaults, stop=["END"])
    assert token_stops == ["END"] and token_level.stop == [] and token_level.bad == []


def test_the_end_id_is_no_stop_word_when_ignored() -> None:
    assert POLICY.stop_tokens() == [[2]] and POLICY.stop_tokens(ignore_eos=True) == []


def test_model_infos_bad_words_need_a_backend_with_bad_words() -> None:
    with pytest.raises(ServiceError) as info:
        policy(backend=Backend(), defaults=Defaults(end_id=2, bad_words=[[5]])).check_backend()
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION and "bad_words" in info.value.message
    policy(defaults=Defaults(end_id=2, bad_words=[[5]])).check_backend()


# -- beam search ---------------------------------------------------------------------------------------

BEAMS = Backend(beam_widths=[2, 3, 4, 8])  # FasterTransformer-like: not every width up to the largest


@pytest.mark.parametrize(("fields", "param", "says"), [
    ({"beam_width": 2}, "num_beams", "not supported by the fake backend"),
    ({"beam_width": 1000}, "num_beams", "one of 1, 2, 3, 4, 8"),
])
def test_beams_beyond_the_backend_are_refused(fields: dict[str, Any], param: str, says: str) -> None:
    backend = FT if fields["beam_width"] == 2 else BEAMS
    assert says in refused(param, backend, **fields)


def test_a_contiguous_range_of_widths_is_named_as_one() -> None:
    assert "between 1 and 4" in refused("num_beams", Backend(beam_widths=[2, 3, 4]), beam_width=5)


@pytest.mark.parametrize(("fields", "param"), [
    ({"beam_width": 5}, "num_beams"),  # FT runs other widths as 1: refused, not silently changed
    ({"beam_width": 2, "n": 3}, "n"),
    ({"beam_width": 2, "logprobs": True}, "logprobs"),
    ({"beam_width": 2, "guide": llm_pb2.Guide(json_object=True)}, "response_format"),
    ({"beam_width": 2, "chat": llm_pb2.Chat(tools=[llm_pb2.Tool(name="f")], tool_choice=llm_pb2.ToolChoice(
        mode="required"))}, "tool_choice"),
])
def test_beam_search_refusals_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    refused(param, Backend("logprobs", "guided_decoding", beam_widths=[2, 3, 4, 8]), **fields)


def test_beam_width_reaches_the_sampling() -> None:
    assert resolve(BEAMS, beam_width=4, n=2)[0].beam_width == 4
    assert resolve(FT, beam_width=1)[0].beam_width == 1  # 1 (and 0) is no beam search, on any backend
    assert resolve(FT)[0].beam_width == 1


def test_fit_max_tokens_cuts_max_tokens_to_what_is_allowed() -> None:
    fit = llm_pb2.GenerateRequest(max_tokens=32000, fit_max_tokens=True)
    assert max_new_tokens(fit, POLICY, 30, "messages") == 70  # the rest of the context
    assert max_new_tokens(fit, policy(max_completion_tokens=50), 30, "messages") == 50  # the model's limit
    assert max_new_tokens(llm_pb2.GenerateRequest(max_tokens=20, fit_max_tokens=True), POLICY, 30, "messages") == 20
    with pytest.raises(ServiceError) as info:  # a prompt that leaves no room is still refused
        max_new_tokens(fit, POLICY, 100, "messages")
    assert info.value.param == "messages" and info.value.error_code == "context_length_exceeded"
    with pytest.raises(ServiceError, match="min_tokens"):
        max_new_tokens(llm_pb2.GenerateRequest(max_tokens=500, min_tokens=80, fit_max_tokens=True), POLICY, 30,
                       "prompt")


def test_hosted_tools_are_served_or_refused_as_the_model_is_configured() -> None:
    hosted = llm_pb2.GenerateRequest(hosted_tools=[llm_pb2.HostedTool(type="web_search", param="tools[8]"),
                                                   llm_pb2.HostedTool(type="code_interpreter", param="tools[9]")])
    assert check_request(hosted, POLICY, 1) == 1  # "ignore", the default
    with pytest.raises(ServiceError) as info:
        check_request(hosted, policy(hosted_tools="refuse"), 1)
    assert info.value.code == grpc.StatusCode.INVALID_ARGUMENT and info.value.param == "tools[8]"
    assert "`web_search`" in info.value.message and "cannot run here" in info.value.message
    assert "configured to refuse" in info.value.message
    assert check_request(llm_pb2.GenerateRequest(), policy(hosted_tools="refuse"), 1) == 1


@pytest.mark.parametrize(("guide", "expected"), [
    (llm_pb2.Guide(json_object=True), Guide("json_schema", '{"type": "object"}')),
    (llm_pb2.Guide(json_schema='{"type": "array"}'), Guide("json_schema", '{"type": "array"}')),
    (llm_pb2.Guide(grammar='root ::= "a"'), Guide("grammar", 'root ::= "a"')),
    (llm_pb2.Guide(regex="[0-9]+"), Guide("regex", "[0-9]+")),
])
def test_response_format_reaches_the_sampling_as_a_guide_of_its_kind(guide: llm_pb2.Guide, expected: Guide) -> None:
    assert resolve(Backend("guided_decoding"), guide=guide)[0].guide == expected
    assert resolve()[0].guide is None
    assert "guided decoding" in refused("response_format", guide=guide)
