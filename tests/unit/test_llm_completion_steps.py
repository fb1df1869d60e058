"""Steps of every backend through one Completion: text steps (stop strings across responses, multi-byte
text, token counts, finish reasons, log probabilities with alternatives) and the options vLLM brought
(include_stop_str_in_output, skip_special_tokens, min_tokens) on token steps too."""

from __future__ import annotations

from typing import Any

import pytest

from services.llm.backends import Step
from services.llm.completion import Completion, CompletionRules
from services.llm.detokenizer import TokenDecoding
from tritongate.llm.v1 import llm_pb2

END_ID = 2


def completion(tokenizer: Any, max_new: int = 50, stops: list[str] | None = None, **options: Any) -> Completion:
    rules = CompletionRules(options.pop("stop_words", [[END_ID]]), stops or [], TokenDecoding.of(tokenizer), **options)
    return Completion(0, [], rules, max_new=max_new)


def run(c: Completion, steps: list[Step]) -> list[llm_pb2.Delta]:
    deltas = []
    for step in steps:
        delta = c.add(step)
        if delta is not None:
            deltas.append(delta)
        if c.done:
            break
    return [*deltas, c.finish()]


def text(deltas: list[llm_pb2.Delta]) -> str:
    return "".join(d.text for d in deltas)


def ids(tokenizer: Any, value: str) -> list[int]:
    return list(tokenizer.encode(value, add_special_tokens=False))


def test_a_stop_string_split_across_responses_is_cut(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=["STOP"])
    deltas = run(c, [Step(text="Hello wo", tokens=2), Step(text="rld ST", tokens=2), Step(text="OP and", tokens=2),
                     Step(text=" more", tokens=1)])
    assert [d.text for d in deltas] == ["Hello wo", "rld ", ""] and deltas[-1].finish_reason == "stop"
    assert c.consumed == 6  # the backend's counts, up to the response that completed the stop


def test_include_stop_str_in_output_keeps_it(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=["STOP"], include_stop=True)
    deltas = run(c, [Step(text="Hello ST", tokens=3), Step(text="OP and", tokens=2)])
    assert text(deltas) == "Hello STOP" and deltas[-1].finish_reason == "stop"


def test_multi_byte_text_and_a_stop_string_of_multi_byte_characters(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=["。\n"])
    deltas = run(c, [Step(text="你好 😀"), Step(text="。"), Step(text="\n再见")])
    assert text(deltas) == "你好 😀" and deltas[-1].finish_reason == "stop"
    c = completion(tokenizer, stops=["。\n"])
    assert text(run(c, [Step(text="你好"), Step(text="。"), Step(text="再见")])) == "你好。再见"


def test_the_backends_finish_reason_wins_unless_the_service_stopped(tokenizer: Any) -> None:
    assert run(completion(tokenizer), [Step(text="a b", finish_reason="length")])[-1].finish_reason == "length"
    # vLLM cut a stop string itself: nothing for the service to find, the reason is the backend's.
    assert run(completion(tokenizer, stops=["x"]), [Step(text="a", finish_reason="stop")])[-1].finish_reason == "stop"
    cut = run(completion(tokenizer, stops=["b"]), [Step(text="a b", finish_reason="length")])
    assert text(cut) == "a " and cut[-1].finish_reason == "stop"


@pytest.mark.parametrize(("steps", "reason", "consumed"), [
    ([Step(text="one", tokens=1), Step(text=" two", tokens=1), Step(text="", tokens=0)], "length", 2),
    ([Step(text="one", tokens=1)], "stop", 1),
    # No counts from the backend: the tokenizer's count of the text, at least one per response with text.
    ([Step(text="one two"), Step(text="")], "length", 2),
    ([Step(text="😀"), Step(text="!")], "length", 4),  # byte-level BPE: the emoji is three tokens
    ([Step(text="one")], "stop", 1),
])
def test_token_counts_decide_length_without_a_reason(tokenizer: Any, steps: list[Step], reason: str,
                                                     consumed: int) -> None:
    c = completion(tokenizer, max_new=2)
    assert run(c, steps)[-1].finish_reason == reason and c.consumed == consumed


def test_uncounted_text_is_counted_up_to_the_stop(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=["STOP"])
    run(c, [Step(text="one two STOP three four five")])
    assert c.consumed == len(ids(tokenizer, "one two STOP"))


def test_min_tokens_defers_stop_strings(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=["x"], min_tokens=3)
    deltas = run(c, [Step(text="ax", tokens=1), Step(text="bx", tokens=1), Step(text="cx", tokens=1)])
    assert text(deltas) == "axbxc"  # the third token reaches min_tokens: its stop counts


def test_prompt_tokens_as_the_backend_counted_them(tokenizer: Any) -> None:
    c = completion(tokenizer)
    run(c, [Step(text="a", tokens=1, prompt_tokens=9), Step(text="", tokens=0, prompt_tokens=9)])
    assert c.prompt_tokens == 9


def test_log_probabilities_of_text_steps_with_alternatives(tokenizer: Any) -> None:
    hello, world, bang = ids(tokenizer, "Hello world!")
    c = completion(tokenizer, stops=["!"])
    deltas = run(c, [
        Step(text="Hello world", tokens=2, token_ids=[hello, world], logprobs=[-0.5, -1.5],
             top_logprobs=[[(hello, -0.5)], [(bang, -0.2), (world, -1.5)]]),
        Step(text="!", tokens=1, token_ids=[bang], logprobs=[-0.1], top_logprobs=[[(bang, -0.1)]]),
    ])
    entries = [e for d in deltas for e in d.logprobs]
    assert [(e.token, e.logprob, e.text_offset) for e in entries] == [("Hello", -0.5, 0), (" world", -1.5, 5)]
    assert [(t.token, t.logprob) for t in entries[1].top_logprobs] == [("!", pytest.approx(-0.2)), (" world", -1.5)]
    assert entries[1].top_logprobs[0].bytes == b"!"  # the stop string's own token was cut with its text


def test_token_steps_keep_the_stop_string_when_asked(tokenizer: Any) -> None:
    c = completion(tokenizer, stops=[" STOP"], include_stop=True)
    deltas = run(c, [Step(ids(tokenizer, "The END. STOP here"))])
    assert text(deltas) == "The END. STOP" and deltas[-1].finish_reason == "stop"


def test_token_steps_decode_special_tokens_when_asked(tokenizer: Any) -> None:
    tokens = [*ids(tokenizer, "<|im_start|>hi"), END_ID]
    assert text(run(completion(tokenizer), [Step(tokens)])) == "hi"
    assert text(run(completion(tokenizer, skip_special_tokens=False), [Step(tokens)])) == "<|im_start|>hi"


def test_min_tokens_defers_stop_words_of_token_steps(tokenizer: Any) -> None:
    tokens = [*ids(tokenizer, "a"), END_ID, *ids(tokenizer, "b"), END_ID]
    c = completion(tokenizer, min_tokens=3)
    deltas = run(c, [Step([t]) for t in tokens])
    assert text(deltas) == "ab" and c.consumed == 4 and deltas[-1].finish_reason == "stop"


def test_without_the_end_id_among_the_stop_words_generation_goes_on(tokenizer: Any) -> None:
    c = completion(tokenizer, max_new=3, stop_words=[])  # ignore_eos: the policy leaves the end id out
    deltas = run(c, [Step([*ids(tokenizer, "a"), END_ID, *ids(tokenizer, "b")])])
    assert text(deltas) == "ab" and deltas[-1].finish_reason == "length"  # the end id decodes to nothing
