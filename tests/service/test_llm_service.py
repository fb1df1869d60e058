"""The llm service as a real grpc.aio server on port 0, against the session's real Triton (ft-echo,
whose continuation echoes the prompt, and SmolLM2's tokenizer)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from launcher.stack import DEMO_LLMS
from services.common.server import RunningService
from tests.support.llm_service import llm_service
from tests.support.ports import wait_until
from tritongate.common.v1 import common_pb2
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc
from tritongate.wire import REQUEST_ID_KEY

SMOLLM2 = "smollm2-135m-instruct"
STRICT_TEMPLATE = (
    "{% for m in messages %}{% if (m.role == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer(models_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models_dir / SMOLLM2)


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


@pytest.fixture(scope="module")
async def service(model_config_file: Path, tokenizer: Any, tmp_path_factory: pytest.TempPathFactory
                  ) -> AsyncIterator[RunningService]:
    """The test config plus three models: one with its own template file (`chat_template`), one with
    model_infos in the layouts Denglin's openai_api writes, one with a default `max_tokens`."""
    folder = tmp_path_factory.mktemp("llm-service")
    (folder / "strict.jinja").write_text(STRICT_TEMPLATE)
    config = json.loads(model_config_file.read_text())  # noqa: ASYNC240 (test set-up)
    echo = next(entry for entry in config["llm"] if entry["name"] == "ft-echo")
    config["llm"] += [dict(echo, name="ft-echo-template", triton_model="ft-echo", chat_template="strict.jinja"),
                      dict(echo, name="ft-echo-denglin", triton_model="ft-echo"),
                      dict(echo, name="ft-echo-capped", triton_model="ft-echo")]
    config["model_infos"].append({"name": "ft-echo-denglin", "end_id": -2, "max_len": 64,
                                  "bad_words": [ids(tokenizer, " bad"), [1]],  # FT's two-row layout
                                  "stop_words": [ids(tokenizer, " the end")]})  # a word of two tokens
    config["model_infos"].append({"name": "ft-echo-capped", "max_len": 256, "max_completion_tokens": 5})
    async with llm_service(config, folder) as running:
        yield running


def completion(model: str, *prompts: str | list[int], **fields: Any) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(model=model, prompts=llm_pb2.Prompts(prompts=[
        llm_pb2.Prompt(text=p) if isinstance(p, str) else llm_pb2.Prompt(token_ids=common_pb2.TokenIds(ids=p))
        for p in prompts]), **fields)


def chat(model: str, *turns: tuple[str, str], **fields: Any) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(model=model, chat=llm_pb2.Chat(messages=[
        llm_pb2.ChatMessage(role=role, content=content) for role, content in turns]), **fields)


async def responses(stub: llm_pb2_grpc.LlmServiceStub, request: llm_pb2.GenerateRequest
                    ) -> list[llm_pb2.GenerateResponse]:
    return [response async for response in stub.Generate(request)]


def texts(messages: list[llm_pb2.GenerateResponse], index: int = 0) -> str:
    return "".join(m.delta.text for m in messages if m.WhichOneof("event") == "delta" and m.delta.index == index)


async def test_accepted_then_deltas_then_usage(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any) -> None:
    prompt = ids(tokenizer, "Hello world! 😀 done")
    # Paced at 50 ms per token, every token's text is its own delta (a lagging reader gets them joined).
    messages = await responses(stub, completion("ft-echo-slow", prompt, max_tokens=len(prompt) + 2))
    kinds = [m.WhichOneof("event") for m in messages]
    assert kinds[0] == "accepted" and kinds[-1] == "usage" and set(kinds[1:-1]) == {"delta"}
    assert messages[0].accepted == llm_pb2.Accepted(prompt_tokens=len(prompt), choices=1)
    deltas = [m.delta for m in messages[1:-1]]
    assert [d.text for d in deltas if d.text] == ["Hello", " world", "!", " 😀", " done", "Hello", " world"]
    assert deltas[-1].finish_reason == "length" and not any(d.finish_reason for d in deltas[:-1])
    assert messages[-1].usage == common_pb2.Usage(prompt_tokens=6, completion_tokens=8, total_tokens=14)
    fast = await responses(stub, completion("ft-echo", prompt, max_tokens=len(prompt) + 2))
    assert texts(fast) == texts(messages) and fast[-1].usage == messages[-1].usage  # timings differ


async def test_list_models(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    cards = {card.id: card for card in (await stub.ListModels(common_pb2.ListModelsRequest())).models}
    assert cards["ft-echo"].kind == common_pb2.MODEL_KIND_LLM and cards["ft-echo"].max_model_len == 256
    assert cards[SMOLLM2].max_model_len == 8192 and cards["ft-echo-slow"].triton_model == "ft-echo"


async def test_the_config_files_template_overrides_the_folders(stub: llm_pb2_grpc.LlmServiceStub,
                                                               tokenizer: Any) -> None:
    rendered = "user: Hi\nassistant: Hello\nuser: Bye\nassistant:"
    messages = await responses(stub, chat("ft-echo-template", ("user", "Hi"), ("assistant", "Hello"),
                                          ("user", "Bye"), max_tokens=len(ids(tokenizer, rendered))))
    assert texts(messages) == rendered  # the echo model repeats the prompt the template made


async def test_denglin_model_infos_layouts(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any) -> None:
    """bad_words in FT's layout keep ' bad' out; a two-token stop word ends the completion and is cut."""
    prompt = ids(tokenizer, "a bad start, the end")
    messages = await responses(stub, completion("ft-echo-denglin", prompt, max_tokens=20))
    assert texts(messages) == "a start,"
    assert messages[-2].delta.finish_reason == "stop"
    assert messages[-1].usage.completion_tokens == len(prompt) - 1  # ' bad' was never generated


@pytest.mark.parametrize(("request_", "code", "param", "says"), [
    (completion("nope", "x"), grpc.StatusCode.NOT_FOUND, "model", "does not exist"),
    (chat("ft-echo-template", ("assistant", "x")), grpc.StatusCode.INVALID_ARGUMENT, "messages",
     "Conversation roles must alternate"),
    (completion("ft-echo", [1, 49152]), grpc.StatusCode.INVALID_ARGUMENT, "prompt", "49152"),
    (completion("ft-echo", ""), grpc.StatusCode.INVALID_ARGUMENT, "prompt", "empty"),
    (completion("ft-echo", "word " * 300), grpc.StatusCode.INVALID_ARGUMENT, "prompt", "maximum context length"),
    (completion("ft-echo", "x", max_tokens=256), grpc.StatusCode.INVALID_ARGUMENT, "max_tokens", "257 tokens"),
    (completion("ft-echo", "x", n=17), grpc.StatusCode.INVALID_ARGUMENT, "n", "between 1 and 16"),
    (completion("ft-echo", "x", frequency_penalty=1), grpc.StatusCode.INVALID_ARGUMENT, "frequency_penalty",
     "not supported by the fastertransformer backend"),
])
async def test_errors_carry_a_code_and_the_parameter(stub: llm_pb2_grpc.LlmServiceStub,
                                                     request_: llm_pb2.GenerateRequest, code: grpc.StatusCode,
                                                     param: str, says: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await responses(stub, request_)
    assert info.value.code() == code and says in (info.value.details() or "")
    assert ("tg-param", param) in tuple(info.value.trailing_metadata() or ())


async def test_n_completions_run_concurrently(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any) -> None:
    prompt = ids(tokenizer, "one two three")
    messages = await responses(stub, completion("ft-echo-slow", prompt, n=3, max_tokens=6))
    order = [m.delta.index for m in messages if m.WhichOneof("event") == "delta"]
    assert sorted(set(order[:4])) != [order[0]]  # interleaved, not one after the other
    assert [texts(messages, i) for i in range(3)] == ["one two threeone two three"] * 3  # the echo repeats
    assert messages[-1].usage.completion_tokens == 18


async def test_max_tokens_0_generates_nothing(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    """Whether 0 is allowed (only with `echo`) is the edge's rule; the service just generates nothing."""
    messages = await responses(stub, chat("ft-echo", ("user", "Hi"), max_tokens=0))
    assert texts(messages) == "" and messages[-2].delta.finish_reason == "length"
    assert messages[-1].usage.completion_tokens == 0


async def test_a_request_without_max_tokens_stops_at_the_models_default(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    """`model_infos` `max_completion_tokens`: the echo would run to the end of its 256-token context."""
    for request in (chat("ft-echo-capped", ("user", "one two three four five six seven")),
                    completion("ft-echo-capped", "one two three four five six seven")):
        messages = await responses(stub, request)
        assert messages[-2].delta.finish_reason == "length" and messages[-1].usage.completion_tokens == 5
    asked = await responses(stub, completion("ft-echo-capped", "one two three", max_tokens=9))  # more may be asked for
    assert texts(asked) == "one two three" * 3 and asked[-1].usage.completion_tokens == 9


# Questions of different lengths: their rows in the demo engine's batch are padded differently.
QUESTIONS = ["Why is the sky blue?", "Explain gravity to a child in simple words please.", "Hi",
             "Write a haiku about the sea.", "Give me a recipe for pancakes with blueberries and maple syrup for a "
             "family breakfast on Sunday morning.", "Name a fruit."]


async def test_a_greedy_text_is_the_same_alone_and_batched_with_others(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    """The demo LLM decodes concurrent requests as one batch; a greedy answer must not depend on it."""
    def ask(question: str) -> llm_pb2.GenerateRequest:
        return chat(DEMO_LLMS["tensorrt_llm"], ("user", question), temperature=0, max_tokens=16)

    alone = [texts(await responses(stub, ask(question))) for question in QUESTIONS]
    together = await asyncio.gather(*(responses(stub, ask(question)) for question in QUESTIONS))
    assert [texts(messages) for messages in together] == alone


def events_since(events_file: Path, offset: int) -> list[dict[str, Any]]:
    return [json.loads(line) for line in events_file.read_text()[offset:].splitlines() if line]


async def test_triton_sees_the_request_id_of_the_metadata_and_the_choice(stub: llm_pb2_grpc.LlmServiceStub,
                                                                          events_file: Path) -> None:
    offset = len(events_file.read_text())  # noqa: ASYNC240 (a small local file)
    call = stub.Generate(completion("ft-echo", "tick tock", n=2, max_tokens=3), metadata=((REQUEST_ID_KEY, "rid-9"),))
    assert [m async for m in call][-1].usage.completion_tokens == 6

    def seen() -> set[str]:
        return {e["request_id"] for e in events_since(events_file, offset)}

    await asyncio.to_thread(wait_until, lambda: {"rid-9-0", "rid-9-1"} <= seen(), 10, "both choices' events")


async def test_cancelling_the_call_cancels_the_triton_request(stub: llm_pb2_grpc.LlmServiceStub,
                                                             events_file: Path) -> None:
    offset = len(events_file.read_text())  # noqa: ASYNC240 (a small local file)
    call = stub.Generate(completion("ft-echo-slow", "tick tock", max_tokens=200))
    deltas = 0
    async for message in call:
        deltas += message.WhichOneof("event") == "delta"
        if deltas == 3:
            call.cancel()
            break
    await asyncio.to_thread(wait_until, lambda: any(e["event"] == "cancelled" for e in
                                                    events_since(events_file, offset)), 10, "the model's cancellation")
    cancelled = [e for e in events_since(events_file, offset) if e["event"] == "cancelled"]
    assert cancelled[0]["tokens"] < 20
