"""The edge's endpoint modules: request models, their rules, and their REST → proto converters."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from edge.app_state import UNLIMITED
from edge.endpoints import chat, completions, embeddings, messages, rerank, responses
from edge.endpoints.chat import ChatCompletionRequest
from edge.endpoints.completions import CompletionRequest
from edge.errors import OpenAIError, from_validation
from tritongate.llm.v1 import llm_pb2

MESSAGES = [{"role": "user", "content": "Hi"}]


def proto_of(body: ChatCompletionRequest | CompletionRequest) -> llm_pb2.GenerateRequest:
    convert = chat.generation_input if isinstance(body, ChatCompletionRequest) else completions.generation_input
    return convert(body).proto()  # type: ignore[arg-type]


def refusal(model: type[BaseModel], body: dict[str, Any]) -> OpenAIError:
    """The 400 the edge answers for `body`, as the error handler builds it from the validation error (every
    rule is checked while validating: converting a validated request cannot fail)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    errors = [{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]
    return from_validation(RequestValidationError(errors))


def test_stream_as_a_string_is_coerced() -> None:
    """Denglin's manual sends "stream": "true" in one example."""
    body = CompletionRequest.model_validate({"model": "m", "prompt": "Once upon a time", "stream": "true",
                                             "max_tokens": 41, "temperature": 0.5})
    assert body.stream is True
    assert ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, "stream": "false"}).stream is False


def test_chat_converter_names_every_field() -> None:
    body = ChatCompletionRequest.model_validate({
        "model": "m", "n": 2, "stop": "\n", "seed": 2**64 - 1, "max_completion_tokens": 9, "max_tokens": 3,
        "temperature": 0, "top_p": 0.5, "top_k": -1, "repetition_penalty": 1.1, "presence_penalty": 0.5,
        "frequency_penalty": 0, "logit_bias": {"42": -100}, "logprobs": True, "do_sample": False,
        "messages": [{"role": "developer", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": None, "name": "bot"}],
    })
    proto = proto_of(body)
    assert [(m.role, m.content, m.name) for m in proto.chat.messages] == [
        ("system", "Be brief.", ""), ("user", "a\nb", ""), ("assistant", "", "bot")]
    assert (proto.n, list(proto.stop), proto.seed, proto.max_tokens) == (2, ["\n"], -1, 9)
    assert (proto.temperature, proto.top_p, proto.top_k) == (0, 0.5, 0)
    assert proto.HasField("frequency_penalty") and dict(proto.logit_bias) == {42: -100}
    assert proto.logprobs and not proto.do_sample and proto.HasField("do_sample")
    assert round(proto.repetition_penalty, 3) == 1.1 and round(proto.presence_penalty, 3) == 0.5


def test_unset_sampling_fields_stay_unset_for_the_models_defaults() -> None:
    proto = proto_of(ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES}))
    for field in ("temperature", "top_p", "top_k", "repetition_penalty", "seed", "max_tokens", "do_sample"):
        assert not proto.HasField(field), field


def test_completion_converter() -> None:
    body = CompletionRequest.model_validate({"model": "m", "prompt": [[1, 2], [3]], "echo": True, "max_tokens": 0,
                                             "logprobs": 0, "n": 2, "best_of": 2})
    proto = proto_of(body)
    assert [list(p.token_ids.ids) for p in proto.prompts.prompts] == [[1, 2], [3]]
    assert proto.echo and proto.max_tokens == 0 and proto.HasField("max_tokens")
    assert proto.logprobs and proto.top_logprobs == 0
    texts = proto_of(CompletionRequest.model_validate({"model": "m", "prompt": "x"}))
    assert [p.text for p in texts.prompts.prompts] == ["x"] and not texts.logprobs


@pytest.mark.parametrize(("body", "loc"), [
    ({"messages": []}, ("messages",)),
    ({"messages": [{"role": "robot", "content": "x"}]}, ("messages", 0, "role")),
    ({"messages": [{"role": "tool", "content": "x"}]}, ("messages", 0, "tool_call_id")),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, ("messages", 0, "tool_calls")),
    ({"messages": [{"role": "user"}]}, ("messages", 0, "content")),
    ({"messages": [{"role": "user", "content": None}]}, ("messages", 0, "content")),
    ({"messages": [{"role": "assistant", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     ("messages", 0, "content")),
    ({"stop": [str(i) for i in range(17)]}, ("stop",)),
    ({"stop": 5}, ("stop",)),
    ({"logit_bias": {"x": 1}}, ("logit_bias",)),
    ({"logit_bias": {"1": 200}}, ("logit_bias",)),
    ({"n": 0}, ("n",)),
    ({"n": 129}, ("n",)),  # OpenAI's bound; each model's own (`max_n`) is the llm service's
    ({"max_tokens": 0}, ("max_tokens",)),
    ({"num_beams": 0}, ("num_beams",)),  # each model's own limit (max_beams) is the llm service's
    ({"repetition_penalty": 1e300}, ("repetition_penalty",)),  # would travel as float32 infinity
    ({"temperature": 2.5}, ("temperature",)),
    ({"top_p": 1.5}, ("top_p",)),
    ({"presence_penalty": 3}, ("presence_penalty",)),
])
def test_chat_validation_locates_the_parameter(body: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **body})
    assert info.value.errors()[0]["loc"][: len(loc)] == loc


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(("body", "param"), [
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools"),
    ({"tools": [TOOL, TOOL]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"enum": ["x" * 70_000]}}}}}]}, "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nonsense"}}}},
     "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"enum": ["x" * 70_000]}}}}}}, "response_format"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"tools": [TOOL], "functions": [{"name": "g"}]}, "functions"),
    ({"functions": [{"name": "g"}], "function_call": {"name": "h"}}, "function_call"),
])
def test_chat_bad_tools_and_formats(body: dict[str, Any], param: str) -> None:
    """Rules across fields are validators or rules of the conversion into the generation input (the only
    way to the llm service): no router can forget them, and the 400 names the parameter."""
    error = refusal(ChatCompletionRequest, {"model": "m", "messages": MESSAGES, **body})
    assert error.status == 400 and error.param == param and not error.message.startswith("Value error")


def test_chat_defaults_are_never_errors() -> None:
    ChatCompletionRequest.model_validate({
        "model": "m", "messages": MESSAGES, "tools": [], "tool_choice": "none", "response_format": {"type": "text"},
        "frequency_penalty": 0, "presence_penalty": 0, "logit_bias": {}, "logprobs": False, "n": 1, "user": "u",
        "stream": False, "top_logprobs": 0, "num_beams": 1, "unknown_extra": 1})


@pytest.mark.parametrize(("body", "param"), [
    ({"suffix": "end"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"best_of": 3, "use_beam_search": True, "num_beams": 2}, "num_beams"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"stream_options": {"include_usage": True}, "stream": False}, "stream_options"),
])
def test_completion_rules_across_fields(body: dict[str, Any], param: str) -> None:
    assert refusal(CompletionRequest, {"model": "m", "prompt": "x", **body}).param == param


def test_nested_rules_are_located_by_their_path() -> None:
    error = refusal(ChatCompletionRequest, {"model": "m", "messages": [*MESSAGES, {"role": "robot", "content": ""}]})
    assert error.param == "messages[1].role" and "robot" in error.message


@pytest.mark.parametrize(("model", "setting", "limit", "body", "param"), [
    (embeddings.EmbeddingRequest, "max_embedding_inputs", 2, {"model": "m", "input": ["a", "b", "c"]}, "input"),
    (rerank.RankingRequest, "max_rerank_documents", 1,
     {"model": "m", "query": {"text": "q"}, "passages": [{"text": "a"}, {"text": "b"}]}, "passages"),
    (rerank.RerankRequest, "max_rerank_documents", 1, {"model": "m", "query": "q", "documents": ["a", "b"]},
     "documents"),
])
def test_per_request_limits_are_checked_while_validating(model: type[BaseModel], setting: str, limit: int,
                                                          body: dict[str, Any], param: str) -> None:
    """The edge's limits reach the validators as pydantic's validation context (the lean routes give it)."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(body, context=replace(UNLIMITED, **{setting: limit}))
    error = from_validation(RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]))
    assert error.param == param and str(limit) in error.message
    model.model_validate(body, context=replace(UNLIMITED, **{setting: limit + 5}))  # within the limit: a request


@pytest.mark.parametrize(("model", "body", "param"), [
    (ChatCompletionRequest, {"messages": MESSAGES, "tools": [{"type": "function", "function": {"name": "a b"}}]},
     "tools"),
    (ChatCompletionRequest, {"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
    (ChatCompletionRequest, {"messages": MESSAGES, "functions": [{"name": "f"}], "function_call": {"name": "g"}},
     "function_call"),
    (ChatCompletionRequest, {"messages": MESSAGES, "response_format": {"type": "xml"}}, "response_format"),
    (responses.ResponseRequest, {"input": "hi", "tools": [{"name": "f"}]}, "tools[0].type"),
    (responses.ResponseRequest, {"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
    (messages.MessagesRequest, {"max_tokens": 8, "messages": MESSAGES, "tool_choice": {"type": "any"}}, "tool_choice"),
    (messages.CountTokensRequest, {"messages": MESSAGES, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
])
def test_tool_and_format_rules_refuse_while_validating(model: type[BaseModel], body: dict[str, Any], param: str
                                                       ) -> None:
    """So that converting a validated request into the generation input cannot fail."""
    with pytest.raises(ValidationError) as info:
        model.model_validate({"model": "m", **body})
    error = from_validation(RequestValidationError([{**e, "loc": ("body", *e["loc"])} for e in info.value.errors()]))
    assert error.param == param


@pytest.mark.parametrize("prompt", [[], "", [[]], [1, "a"], [-1], {"text": "x"}, 5, [[1], ["a"]]])
def test_completion_prompt_shapes(prompt: Any) -> None:
    if prompt == "":  # an empty string is a valid shape; the service refuses it (no tokens)
        assert CompletionRequest.model_validate({"model": "m", "prompt": prompt}).prompt == [""]
        return
    with pytest.raises(ValidationError) as info:
        CompletionRequest.model_validate({"model": "m", "prompt": prompt})
    assert info.value.errors()[0]["loc"] == ("prompt",)


def test_vllm_style_knobs_reach_the_proto() -> None:
    body = ChatCompletionRequest.model_validate({
        "model": "m", "messages": MESSAGES, "min_p": 0.05, "min_tokens": 3, "ignore_eos": True,
        "include_stop_str_in_output": True, "skip_special_tokens": False,
        "chat_template_kwargs": {"enable_thinking": False, "style": {"tone": "dry"}}})
    proto = proto_of(body)
    assert round(proto.min_p, 3) == 0.05 and proto.min_tokens == 3 and proto.HasField("min_tokens")
    assert proto.ignore_eos and proto.include_stop_str_in_output
    assert proto.HasField("skip_special_tokens") and not proto.skip_special_tokens
    assert dict(proto.chat_template_kwargs) == {"enable_thinking": False, "style": {"tone": "dry"}}
    bare = proto_of(ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES}))
    assert not bare.HasField("min_p") and not bare.HasField("skip_special_tokens") and not bare.chat_template_kwargs


@pytest.mark.parametrize(("body", "loc"), [({"min_p": 1.5}, ("min_p",)), ({"min_tokens": -1}, ("min_tokens",)),
                                           ({"chat_template_kwargs": [1]}, ("chat_template_kwargs",))])
def test_vllm_style_knobs_are_validated(body: dict[str, Any], loc: tuple[Any, ...]) -> None:
    with pytest.raises(ValidationError) as info:
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, **body})
    assert info.value.errors()[0]["loc"][: len(loc)] == loc


def test_alternatives_appear_as_top_logprobs_in_both_shapes() -> None:
    entry = llm_pb2.TokenLogprob(token="a", logprob=-0.1, bytes=b"a", top_logprobs=[
        llm_pb2.TopLogprob(token="a", logprob=-0.1, bytes=b"a"), llm_pb2.TopLogprob(token="b", logprob=-2.5)])
    delta = llm_pb2.Delta(index=0, text="a", logprobs=[entry])
    chat_entry = chat.ChatShape(logprobs=True).delta(delta)["logprobs"]["content"][0]
    assert chat_entry["top_logprobs"] == [{"token": "a", "logprob": pytest.approx(-0.1), "bytes": [97]},
                                          {"token": "b", "logprob": -2.5, "bytes": None}]
    legacy = completions.CompletionShape(logprobs=True).delta(delta)["logprobs"]["top_logprobs"]
    assert legacy == [{"a": pytest.approx(-0.1), "b": -2.5}]
    plain = llm_pb2.Delta(index=0, text="a", logprobs=[llm_pb2.TokenLogprob(token="a", logprob=-0.5)])
    assert completions.CompletionShape(logprobs=True).delta(plain)["logprobs"]["top_logprobs"] == [{"a": -0.5}]
    assert chat.ChatShape(logprobs=True).delta(plain)["logprobs"]["content"][0]["top_logprobs"] == []


@pytest.mark.parametrize(("first", "order"), [
    (None, ["embed-a", "llm-a", "llm-b"]),  # no default LLM: the services' order
    ("llm-b", ["llm-b", "embed-a", "llm-a"]),  # the default LLM first, the rest in their order
    ("gone", ["embed-a", "llm-a", "llm-b"]),  # a default no service lists changes nothing
])
def test_the_model_list_puts_the_default_llm_first(first: str | None, order: list[str]) -> None:
    from edge.endpoints.models import model_list
    from tritongate.common.v1 import common_pb2

    kinds = {"embed": common_pb2.MODEL_KIND_EMBEDDING, "llm": common_pb2.MODEL_KIND_LLM}
    cards = [common_pb2.ModelCard(id=name, kind=kinds[name.split("-")[0]]) for name in ("embed-a", "llm-a", "llm-b")]
    assert [model["id"] for model in model_list(cards, first)["data"]] == order
