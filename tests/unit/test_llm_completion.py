"""One completion's pipeline (stop words → detokenizer → stop strings, log probabilities alongside)
and the merging of concurrent completions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from services.llm.backends import PromptLogprob, Step
from services.llm.completion import JOIN_TURNS, Completion, CompletionRules, coalesce, merge
from services.llm.detokenizer import TokenDecoding
from tritongate.llm.v1 import llm_pb2

END_ID = 2



def completion(tokenizer: Any, max_new: int = 50, stops: list[str] | None = None, echo: str = "",
               stop_words: list[list[int]] | None = None, prompt_logprobs: bool = False) -> Completion:
    rules = CompletionRules([[END_ID], *(stop_words or [])], stops or [], TokenDecoding.of(tokenizer))
    return Completion(0, [], rules, max_new=max_new, echo=echo, prompt_logprobs=prompt_logprobs)


def run(c: Completion, steps: list[list[int]], logprobs: bool = False) -> list[llm_pb2.Delta]:
    deltas, count = [], 0
    for step in steps:
        values = [-(count + i + 1) / 10 for i in range(len(step))] if logprobs else None
        count += len(step)
        delta = c.feed(step, values)
        if delta is not None:
            deltas.append(delta)
        if c.done:
            break
    return [*deltas, c.finish()]


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def test_the_end_id_ends_the_completion_and_is_dropped(tokenizer: Any) -> None:
    c = completion(tokenizer)
    deltas = run(c, [[t] for t in [*ids(tokenizer, "Paris."), END_ID, *ids(tokenizer, "more")]])
    assert [d.text for d in deltas] == ["Paris", ".", ""] and deltas[-1].finish_reason == "stop"
    assert deltas[-1].stop_string == ""  # the end id is no stop string
    assert c.consumed == 3


def test_length(tokenizer: Any) -> None:
    c = completion(tokenizer, max_new=2)
    deltas = run(c, [ids(tokenizer, "one two three")])
    assert "".join(d.text for d in deltas) == "one two" and deltas[-1].finish_reason == "length"


def test_a_stop_string_split_across_tokens_in_multi_token_steps(tokenizer: Any) -> None:
    tokens = ids(tokenizer, "The END. STOP here")  # ' STOP' is ' ST' + 'OP'
    c = completion(tokenizer, stops=[" STOP"])
    deltas = run(c, [tokens[:2], tokens[2:4], tokens[4:]], logprobs=True)
    assert [d.text for d in deltas] == ["The END", ".", ""] and deltas[-1].finish_reason == "stop"
    assert deltas[-1].stop_string == " STOP" and not any(d.stop_string for d in deltas[:-1])
    assert c.consumed == 5  # up to the token that completed the stop string
    entries = [e for d in deltas for e in d.logprobs]
    assert [(e.token, e.text_offset) for e in entries] == [("The", 0), (" END", 3), (".", 7)]
    assert [round(e.logprob, 3) for e in entries] == [-0.1, -0.2, -0.3]


def test_log_probs_of_a_split_character_go_out_with_it(tokenizer: Any) -> None:
    c = completion(tokenizer, echo="Say: ")
    assert c.start() == llm_pb2.Delta(text="Say: ")
    deltas = run(c, [[t] for t in ids(tokenizer, "hi 😀")], logprobs=True)
    texts = [d.text for d in deltas]
    assert texts == ["hi", " 😀", ""]
    assert [len(d.logprobs) for d in deltas] == [1, 2, 0]
    assert [e.text_offset for e in deltas[1].logprobs] == [7, 7]  # after the echoed "Say: hi"
    assert deltas[-1].finish_reason == "stop"  # the generator ended before max_new


def prompt_entries(tokenizer: Any, text: str) -> list[PromptLogprob]:
    tokens = ids(tokenizer, text)
    return [PromptLogprob(t, None if i == 0 else -i / 10, [] if i == 0 else [(t, -i / 10), (END_ID, -5.0)])
            for i, t in enumerate(tokens)]


def test_the_echo_waits_for_the_prompt_s_log_probabilities_and_carries_them(tokenizer: Any) -> None:
    echo = "Say: héllo"
    c = completion(tokenizer, echo=echo, prompt_logprobs=True)
    assert c.start() is None  # the first step brings them
    first = c.add(Step(ids(tokenizer, " there"), logprobs=[-0.7], prompt_logprobs=prompt_entries(tokenizer, echo)))
    assert first is not None and first.text == echo + " there"
    entries = list(first.logprobs)
    prompt = ids(tokenizer, echo)
    assert [e.token for e in entries[:len(prompt)]] == [tokenizer.decode([t]) for t in prompt]
    assert not entries[0].HasField("logprob") and entries[1].HasField("logprob")  # the first: null
    assert [round(e.logprob, 3) for e in entries[1:len(prompt)]] == [-i / 10 for i in range(1, len(prompt))]
    assert [len(e.top_logprobs) for e in entries[:len(prompt)]] == [0] + [2] * (len(prompt) - 1)
    offsets = [e.text_offset for e in entries]
    assert offsets[0] == 0 and offsets == sorted(offsets) and offsets[len(prompt)] == len(echo)  # " there"
    pieces = [echo[a:b] for a, b in zip(offsets[:len(prompt)], [*offsets[1:len(prompt)], len(echo)], strict=True)]
    assert "".join(pieces) == echo and pieces[0] == "Say"
    assert round(entries[-1].logprob, 3) == -0.7


def test_max_tokens_0_keeps_only_the_echo_of_what_the_backend_generated(tokenizer: Any) -> None:
    c = completion(tokenizer, max_new=0, echo="a b", prompt_logprobs=True)
    first = c.add(Step(ids(tokenizer, " c"), logprobs=[-1.0], prompt_logprobs=prompt_entries(tokenizer, "a b")))
    assert first is not None and first.text == "a b" and len(first.logprobs) == 2
    assert c.add(Step(ids(tokenizer, " d"), logprobs=[-1.0])) is None
    last = c.finish()
    assert last.text == "" and not last.logprobs and last.finish_reason == "length" and c.consumed == 0


def test_the_echo_still_goes_out_when_no_step_came(tokenizer: Any) -> None:
    c = completion(tokenizer, max_new=0, echo="a b", prompt_logprobs=True)
    assert c.finish().text == "a b"


def test_model_infos_stop_words_of_several_tokens(tokenizer: Any) -> None:
    word = ids(tokenizer, " over and")
    c = completion(tokenizer, stop_words=[word])
    deltas = run(c, [[t] for t in ids(tokenizer, "game over again, game over and out")])
    assert "".join(d.text for d in deltas) == "game over again, game" and deltas[-1].finish_reason == "stop"


def test_held_back_text_is_released_at_the_end(tokenizer: Any) -> None:
    tokens = ids(tokenizer, "x ab")
    c = completion(tokenizer, max_new=len(tokens), stops=["abc"])
    deltas = run(c, [tokens])
    assert "".join(d.text for d in deltas) == "x ab" and deltas[-1].finish_reason == "length"


def test_text_held_for_a_stop_string_goes_out_when_the_end_id_comes(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=["abc"])
    deltas = run(c, [[t] for t in [*ids(tokenizer, "x ab"), END_ID]])
    assert "".join(d.text for d in deltas) == "x ab" and deltas[-1].finish_reason == "stop"


async def _items(values: list[int], delay: float, fail: bool = False) -> AsyncGenerator[int, None]:
    for value in values:
        await asyncio.sleep(delay)
        yield value
    if fail:
        raise RuntimeError("boom")


async def test_merge_interleaves_concurrent_streams() -> None:
    got = [item async for batch in merge([_items([1, 2, 3], 0.02), _items([10, 20, 30], 0.03)]) for item in batch]
    assert sorted(got) == [1, 2, 3, 10, 20, 30] and got.index(10) < got.index(3)


async def test_merge_batches_what_arrived_while_the_reader_was_busy() -> None:
    batches = []
    async for batch in merge([_items(list(range(6)), 0.01)]):
        batches.append(batch)
        await asyncio.sleep(0.035)  # a slow reader
    assert [item for batch in batches for item in batch] == list(range(6))
    assert batches[0] == [0] and len(batches) < 6


async def test_merge_joins_what_arrives_within_a_few_turns_of_the_loop_and_no_later() -> None:
    async def after_turns(value: str, turns: int) -> AsyncGenerator[str, None]:
        for _ in range(turns):
            await asyncio.sleep(0)
        yield value

    async def later(value: str) -> AsyncGenerator[str, None]:
        await asyncio.sleep(0.05)
        yield value

    assert JOIN_TURNS > 3
    batches = [batch async for batch in merge([after_turns("a", 0), after_turns("b", 3), later("c")])]
    assert batches == [["a", "b"], ["c"]]


async def _fast() -> AsyncGenerator[int, None]:
    for value in range(8):
        for _ in range(JOIN_TURNS + 2):  # each item after the previous batch's join window
            await asyncio.sleep(0)
        yield value


async def test_after_the_first_batch_what_comes_within_the_interval_leaves_together() -> None:
    batches = [batch async for batch in merge([_fast()], min_interval_s=0.2)]  # far longer than the stream takes
    assert batches == [[0], [1, 2, 3, 4, 5, 6, 7]]  # the first at once, the rest within the interval


async def test_a_stream_that_ends_does_not_wait_out_the_interval() -> None:
    async def collect() -> list[list[int]]:  # an hour's interval: only the end can let the last batch go
        return [batch async for batch in merge([_fast()], min_interval_s=3600)]

    assert await asyncio.wait_for(collect(), 30) == [[0], [1, 2, 3, 4, 5, 6, 7]]


async def test_with_no_interval_each_item_past_the_join_window_leaves_alone() -> None:
    batches = [batch async for batch in merge([_fast()], min_interval_s=0)]
    assert batches == [[value] for value in range(8)]


def test_coalesce_joins_increments_per_completion() -> None:
    entry = llm_pb2.TokenLogprob(token="a", logprob=-1)
    deltas = [llm_pb2.Delta(index=0, text="a", logprobs=[entry]), llm_pb2.Delta(index=1, text="x"),
              llm_pb2.Delta(index=0, text="b", logprobs=[entry]), llm_pb2.Delta(index=0, finish_reason="stop")]
    assert coalesce(deltas) == [llm_pb2.Delta(index=0, text="ab", logprobs=[entry, entry], finish_reason="stop"),
                                llm_pb2.Delta(index=1, text="x")]


async def test_merge_passes_on_what_arrived_with_a_failure_before_raising_it() -> None:
    received = []
    with pytest.raises(RuntimeError, match="boom"):
        async for batch in merge([_items([1, 2, 3], 0, fail=True)]):  # items and failure in one batch
            received.extend(batch)
    assert received == [1, 2, 3]


async def test_merge_fails_when_one_stream_fails_and_closes_the_others() -> None:
    closed = asyncio.Event()

    async def endless() -> AsyncGenerator[int, None]:
        try:
            while True:
                await asyncio.sleep(0.01)
                yield 0
        finally:
            closed.set()

    with pytest.raises(RuntimeError, match="boom"):
        async for _ in merge([endless(), _items([1], 0.02, fail=True)]):
            pass
    await asyncio.wait_for(closed.wait(), 1)
