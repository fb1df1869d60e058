"""Incremental detokenization with SmolLM2's byte-level BPE tokenizer, where one character can span
several tokens."""

from __future__ import annotations

import random
from typing import Any

import pytest

from services.llm.detokenizer import REPLACEMENT, Detokenizer, TokenText, text_decoder


def pieces(tokenizer: Any, ids: list[int], context: list[int] | None = None) -> list[str]:
    detokenizer = Detokenizer(text_decoder(tokenizer), context or [])
    out = [detokenizer.add(token) for token in ids]
    return [*out, detokenizer.flush()]


def test_an_emoji_split_over_two_tokens_comes_out_whole(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello world! 😀 done", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in ids][3:5] == [" " + REPLACEMENT, REPLACEMENT]  # the split
    assert pieces(tokenizer, ids) == ["Hello", " world", "!", "", " 😀", " done", ""]


def test_cjk_characters_split_over_tokens_come_out_whole(tokenizer: Any) -> None:
    text = "北京是中国的首都。"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(ids) > len(text)  # several characters take more than one token
    out = pieces(tokenizer, ids)
    assert "".join(out) == text
    assert all(REPLACEMENT not in piece for piece in out)
    assert [piece for piece in out if piece] == list(text)


@pytest.mark.parametrize("seed", range(10))
def test_concatenated_pieces_equal_the_decoded_text(tokenizer: Any, seed: int) -> None:
    rng = random.Random(seed)
    words = ["hello", " world", " 😀", "🎉", " 北京", "é", " naïve", "\n", " Ωμέγα", "—", " tab\t", "123"]
    text = "".join(rng.choice(words) for _ in range(40))
    ids = tokenizer.encode(text, add_special_tokens=False)
    context = tokenizer.encode(rng.choice(words), add_special_tokens=False)
    out = pieces(tokenizer, ids, context)
    assert "".join(out) == tokenizer.decode(ids)
    assert all(REPLACEMENT not in piece for piece in out)


def test_special_tokens_are_skipped(tokenizer: Any) -> None:
    ids = tokenizer.encode("Hi", add_special_tokens=False)
    assert "".join(pieces(tokenizer, [1, *ids, 2])) == "Hi"


def test_a_prompt_that_ends_inside_a_character(tokenizer: Any) -> None:
    ids = tokenizer.encode("a 😀 b", add_special_tokens=False)
    split = next(i for i in range(1, len(ids)) if tokenizer.decode(ids[:i]).endswith(REPLACEMENT))
    out = pieces(tokenizer, ids[split:], context=ids[:split])
    # The continuation byte alone is not a character: it comes out as U+FFFD, once, with the rest.
    assert "".join(out) == tokenizer.decode(ids[split:])
    assert out[-1] == "" and out[0] == ""


def test_an_unfinished_character_at_the_end_is_flushed(tokenizer: Any) -> None:
    ids = tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]
    out = pieces(tokenizer, ids)
    assert out[:-1] == ["ok", ""] and out[-1] == " " + REPLACEMENT


def test_token_bytes_of_a_split_character_join_up(tokenizer: Any) -> None:
    token_text = TokenText(tokenizer)
    ids = tokenizer.encode(" 😀", add_special_tokens=False)
    assert len(ids) == 2
    assert b"".join(token_text.bytes(i) for i in ids) == " 😀".encode()
    assert token_text.text(ids[1]) == REPLACEMENT
    assert token_text.bytes(tokenizer.eos_token_id) == b"<|im_end|>"
