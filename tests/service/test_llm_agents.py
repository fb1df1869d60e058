"""What agent clients need of the llm service, as a real grpc.aio server against the session's real Triton:
custom tools (their calls unwrapped in `auto`, a forced one's grammar sent as its kind to the echo models
and enforced by the demo TensorRT-LLM model's guided decoding), hosted tools ignored or refused,
`fit_max_tokens`, and the prompt tokens TensorRT-LLM reports reusing from its KV cache."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from launcher.stack import DEMO_LLMS
from services.common.server import RunningService
from tests.support.events import events_offset, read_events
from tests.support.llm_service import llm_service
from tests.support.ports import wait_until
from tritongate.llm.v1 import llm_pb2, llm_pb2_grpc
from tritongate.wire import REQUEST_ID_KEY

TRTLLM_DEMO, VLLM_DEMO = DEMO_LLMS["tensorrt_llm"], DEMO_LLMS["vllm"]
PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+Hello "world" {}\n*** End Patch\n'
APPLY_PATCH = llm_pb2.Tool(name="apply_patch", description="Edit files with a patch.", custom=True)
WEATHER = llm_pb2.Tool(name="get_weather", parameters='{"type": "object", "properties": {"city": {"type": "string"}}}')
# A patch of one new file whose one line is one of three words: a grammar the output must follow to its end.
PATCH_GRAMMAR = ('root ::= "*** Begin Patch\\n*** Add File: hello.txt\\n+" ("Hello" | "Bonjour" | "Hallo") '
                 '"\\n*** End Patch\\n"')
PATCH_PATTERN = re.compile(r"\*\*\* Begin Patch\n\*\*\* Add File: hello\.txt\n\+(Hello|Bonjour|Hallo)\n"
                           r"\*\*\* End Patch\n")


@pytest.fixture(scope="module")
async def service(model_config_file: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningService]:
    """The session's models this file drives, and two variants of ft-echo: one that refuses hosted tools, one
    that generates at most 5 tokens per completion."""
    folder = tmp_path_factory.mktemp("llm-agents")
    config = json.loads(model_config_file.read_text())  # noqa: ASYNC240 (test set-up)
    wanted = ("ft-echo", "ft-echo-hermes", "trtllm-echo", "trtllm-text-echo", "vllm-echo", TRTLLM_DEMO, VLLM_DEMO)
    entries = {entry["name"]: entry for entry in config["llm"]}
    echo = entries["ft-echo"]
    config["llm"] = [entries[name] for name in wanted] + [
        dict(echo, name="ft-echo-no-hosted", triton_model="ft-echo", hosted_tools="refuse"),
        dict(echo, name="ft-echo-capped", triton_model="ft-echo", max_completion_tokens=5)]
    config["model_infos"] += [{"name": name, "max_len": 256} for name in ("ft-echo-no-hosted", "ft-echo-capped")]
    async with llm_service(config, folder) as running:
        yield running


async def generate(stub: llm_pb2_grpc.LlmServiceStub, request: llm_pb2.GenerateRequest, request_id: str = ""
                   ) -> list[llm_pb2.GenerateResponse]:
    kwargs: dict[str, Any] = {"metadata": ((REQUEST_ID_KEY, request_id),)} if request_id else {}
    return [response async for response in stub.Generate(request, **kwargs)]


def chat(model: str, content: str, *tools: llm_pb2.Tool, function: str = "", **fields: Any) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(model=model, chat=llm_pb2.Chat(
        messages=[llm_pb2.ChatMessage(role="user", content=content)], tools=tools,
        tool_choice=llm_pb2.ToolChoice(mode="auto", function=function)), **fields)


def completion(model: str, prompt: str, **fields: Any) -> llm_pb2.GenerateRequest:
    return llm_pb2.GenerateRequest(model=model, prompts=llm_pb2.Prompts(prompts=[llm_pb2.Prompt(text=prompt)]),
                                   **fields)


def deltas(messages: list[llm_pb2.GenerateResponse]) -> list[llm_pb2.Delta]:
    return [m.delta for m in messages if m.WhichOneof("event") == "delta"]


def tool_calls(messages: list[llm_pb2.GenerateResponse]) -> list[tuple[str, str]]:
    """(name, arguments) of each call, its pieces joined."""
    calls: dict[int, list[str]] = {}
    for piece in [call for delta in deltas(messages) for call in delta.tool_calls]:
        calls.setdefault(piece.index, [piece.name]).append(piece.arguments)
    return [(parts[0], "".join(parts[1:])) for _, parts in sorted(calls.items())]


def finish_reason(messages: list[llm_pb2.GenerateResponse]) -> str:
    return next(d.finish_reason for d in deltas(messages) if d.finish_reason)


async def completed(events_file: Path, offset: int, request_id: str) -> dict[str, Any]:
    """The test model's `completed` event of choice 0 of the request."""
    def found() -> list[dict[str, Any]]:
        return [e for e in read_events(events_file, offset)
                if e["request_id"] == f"{request_id}-0" and e["event"] == "completed"]

    await asyncio.to_thread(wait_until, lambda: bool(found()), 10, "the request's completed event")
    return found()[0]


async def test_a_custom_tools_call_comes_back_with_its_raw_input(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    """ft-echo-hermes answers with the user's message: here, a Hermes call of the custom tool."""
    answer = "Patching.\n<tool_call>\n" + json.dumps({"name": "apply_patch", "arguments": {"input": PATCH}}) + \
        "\n</tool_call>"
    messages = await generate(stub, chat("ft-echo-hermes", answer, APPLY_PATCH, WEATHER, max_tokens=150))
    assert tool_calls(messages) == [("apply_patch", PATCH)]
    assert "".join(d.text for d in deltas(messages)) == "Patching.\n" and finish_reason(messages) == "tool_calls"


@pytest.mark.parametrize(("model", "sent"), [
    ("trtllm-echo", lambda grammar: {"guide_type": "ebnf_grammar", "guide": grammar}),
    ("vllm-echo", lambda grammar: {"structured_outputs": {"grammar": grammar}}),
])
async def test_a_forced_custom_tools_grammar_reaches_the_backend_as_a_grammar(
        stub: llm_pb2_grpc.LlmServiceStub, events_file: Path, model: str, sent: Any) -> None:
    """The echo models check the guide and report it (they cannot enforce it: their answer is the echo)."""
    tool = llm_pb2.Tool(name="apply_patch", custom=True, grammar=llm_pb2.Guide(grammar=PATCH_GRAMMAR))
    offset, request_id = events_offset(events_file), f"custom-{model}"
    messages = await generate(stub, chat(model, "Hi", tool, function="apply_patch", max_tokens=4), request_id)
    event = await completed(events_file, offset, request_id)
    assert {key: event.get(key) for key in sent(PATCH_GRAMMAR)} == sent(PATCH_GRAMMAR)
    (name, raw), = tool_calls(messages)  # the whole output is the input, as it came
    assert name == "apply_patch" and raw == "system\nYou" and finish_reason(messages) == "length"


async def test_a_regular_expression_reaches_the_backend_as_one(stub: llm_pb2_grpc.LlmServiceStub,
                                                                events_file: Path) -> None:
    tool = llm_pb2.Tool(name="answer", custom=True, grammar=llm_pb2.Guide(regex="(yes|no)"))
    offset = events_offset(events_file)
    await generate(stub, chat("trtllm-echo", "Hi", tool, function="answer", max_tokens=2), "custom-regex")
    event = await completed(events_file, offset, "custom-regex")
    assert (event["guide_type"], event["guide"]) == ("regex", "(yes|no)")


@pytest.mark.parametrize("model", [TRTLLM_DEMO, VLLM_DEMO])
async def test_a_forced_custom_tool_is_held_to_its_grammar_by_guided_decoding(
        stub: llm_pb2_grpc.LlmServiceStub, model: str) -> None:
    """The demo SmolLM2 behind TensorRT-LLM's and vLLM's interfaces, whose guided decoding is xgrammar's, as
    the backends'."""
    tool = llm_pb2.Tool(name="apply_patch", description="Edit files with a patch.", custom=True,
                        grammar=llm_pb2.Guide(grammar=PATCH_GRAMMAR))
    request = chat(model, "Create hello.txt saying hello.", tool, function="apply_patch", max_tokens=40,
                   temperature=0)
    messages = await generate(stub, request)
    (name, raw), = tool_calls(messages)
    assert name == "apply_patch" and PATCH_PATTERN.fullmatch(raw), raw
    assert finish_reason(messages) == "tool_calls" and len([d for d in deltas(messages) if d.tool_calls]) > 1
    answer = llm_pb2.Tool(name="answer", custom=True, grammar=llm_pb2.Guide(regex=r"(yes|no)\."))
    messages = await generate(stub, chat(model, "Is Paris in France?", answer, function="answer", max_tokens=8,
                                         temperature=0))
    assert tool_calls(messages)[0][1] in ("yes.", "no.") and finish_reason(messages) == "tool_calls"


async def test_a_grammar_the_backend_cannot_compile_is_the_clients_mistake(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    tool = llm_pb2.Tool(name="apply_patch", custom=True, grammar=llm_pb2.Guide(grammar="root ::= ("))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, chat(TRTLLM_DEMO, "Hi", tool, function="apply_patch", max_tokens=4))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "grammar compiler rejected it" in str(info.value.details())
    assert ("tg-param", "tools") in tuple(info.value.trailing_metadata() or ())


async def test_a_backend_without_guided_decoding_refuses_only_a_forced_grammar(
        stub: llm_pb2_grpc.LlmServiceStub) -> None:
    grammar = llm_pb2.Tool(name="apply_patch", custom=True, grammar=llm_pb2.Guide(grammar=PATCH_GRAMMAR))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, chat("ft-echo", "Hi", grammar, function="apply_patch", max_tokens=4))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "guided decoding" in str(info.value.details())
    assert ("tg-param", "tool_choice") in tuple(info.value.trailing_metadata() or ())
    free = await generate(stub, chat("ft-echo", "Hi", APPLY_PATCH, function="apply_patch", max_tokens=4))
    assert tool_calls(free) == [("apply_patch", "system\nYou")]  # any text: nothing to enforce


HOSTED = [llm_pb2.HostedTool(type="web_search", param="tools[2]"), llm_pb2.HostedTool(type="mcp", param="tools[3]")]


async def test_hosted_tools_are_ignored_unless_the_model_refuses_them(stub: llm_pb2_grpc.LlmServiceStub) -> None:
    served = await generate(stub, completion("ft-echo", "one two", max_tokens=2, hosted_tools=HOSTED))
    assert "".join(d.text for d in deltas(served)) == "one two"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, completion("ft-echo-no-hosted", "one two", max_tokens=2, hosted_tools=HOSTED))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = str(info.value.details())
    assert "`web_search`" in details and "cannot run here" in details and "configured to refuse" in details
    assert ("tg-param", "tools[2]") in tuple(info.value.trailing_metadata() or ())


async def test_fit_max_tokens_cuts_max_tokens_to_what_the_model_allows(stub: llm_pb2_grpc.LlmServiceStub,
                                                                       tokenizer: Any) -> None:
    prompt = "one two three"
    room = 256 - len(tokenizer.encode(prompt, add_special_tokens=True))  # ft-echo's max_len is 256
    fitted = await generate(stub, completion("ft-echo", prompt, max_tokens=32000, fit_max_tokens=True))
    assert fitted[-1].usage.completion_tokens == room and finish_reason(fitted) == "length"
    capped = await generate(stub, completion("ft-echo-capped", prompt, max_tokens=32000, fit_max_tokens=True))
    assert capped[-1].usage.completion_tokens == 5
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await generate(stub, completion("ft-echo", prompt, max_tokens=32000))
    assert ("tg-param", "max_tokens") in tuple(info.value.trailing_metadata() or ())


@pytest.mark.parametrize("model", ["trtllm-echo", "trtllm-text-echo"])
async def test_a_shared_prefix_is_reported_as_cached_tokens(stub: llm_pb2_grpc.LlmServiceStub, tokenizer: Any,
                                                            model: str) -> None:
    """The echo models remember the prompts they served and report the full KV cache blocks (64 tokens, as
    `llm[].tokens_per_block`'s default) of the longest prefix a new prompt shares with one of them."""
    prefix = f"{uuid.uuid4().hex} " + "the same long instructions for every turn " * 20
    first, second = prefix + "First question?", prefix + "Second question, longer?"
    ids = [tokenizer.encode(prompt, add_special_tokens=True) for prompt in (first, second)]
    shared = next(i for i, (a, b) in enumerate(zip(*ids, strict=False)) if a != b)
    assert shared >= 128
    fresh = await generate(stub, completion(model, first, max_tokens=1))
    assert fresh[-1].usage.cached_tokens == 0 and fresh[-1].usage.prompt_tokens == len(ids[0])
    again = await generate(stub, completion(model, second, max_tokens=1))
    assert again[-1].usage.cached_tokens == shared // 64 * 64 and again[-1].usage.prompt_tokens == len(ids[1])
    repeated = await generate(stub, completion(model, second, max_tokens=1))
    assert repeated[-1].usage.cached_tokens == (len(ids[1]) - 1) // 64 * 64  # never the prompt's last token
