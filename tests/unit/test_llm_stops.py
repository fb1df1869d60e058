"""Stop strings on streamed text and token-id stop words on streamed tokens."""

from __future__ import annotations

import random

import pytest

from services.llm.stops import StopStrings, StopTokens


def feed_all(stops: StopStrings, pieces: list[str]) -> tuple[list[str], bool]:
    out = []
    for piece in pieces:
        out.append(stops.feed(piece))
        if stops.stopped:
            break
    if not stops.stopped:
        out.append(stops.flush())
    return out, stops.stopped


def test_a_stop_split_across_pieces_is_held_back_then_cut() -> None:
    out, stopped = feed_all(StopStrings([" STOP"]), ["The", " END", ".", " ST", "OP", " here"])
    assert stopped and out == ["The", " END", ".", "", ""]


def test_held_text_goes_out_when_the_stop_does_not_complete() -> None:
    out, stopped = feed_all(StopStrings([" STOP"]), ["a", " ST", "ar", " S"])
    assert not stopped and out == ["a", "", " STar", "", " S"]


def test_the_earliest_completed_stop_wins() -> None:
    stops = StopStrings(["abcd", "c"])
    assert stops.feed("xab") == "x"  # "ab" may begin "abcd"
    assert stops.feed("cd") == "ab" and stops.stopped  # "c" completed first: cut before it
    assert stops.matched == "c"


def test_a_stop_inside_one_piece_cuts_within_it() -> None:
    stops = StopStrings(["\n\n"])
    assert stops.feed("Hello\n\nWorld") == "Hello" and stops.stopped
    assert stops.feed("more") == ""


def test_no_stops_passes_everything_through() -> None:
    stops = StopStrings([])
    assert stops.feed("anything") == "anything" and stops.flush() == "" and not stops.stopped


@pytest.mark.parametrize("seed", range(20))
def test_any_split_gives_the_text_before_the_first_stop(seed: int) -> None:
    rng = random.Random(seed)
    alphabet = "ab \n"
    text = "".join(rng.choice(alphabet) for _ in range(60))
    stops = ["ab a", "\n\n", "bb"]
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    pieces = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    out, stopped = feed_all(StopStrings(stops), pieces)
    # The stop that ends first in the text decides; the cut is at its start.
    ends = [(text.find(s) + len(s), text.find(s)) for s in stops if text.find(s) >= 0]
    expected = text[: min(ends)[1]] if ends else text
    assert stopped == bool(ends)
    assert "".join(out) == expected


def test_token_stop_word_is_dropped_and_counted() -> None:
    stops = StopTokens([[2]])
    assert stops.feed([5, 6, 2, 7]) == [5, 6]
    assert stops.stopped and stops.consumed == 3


def test_multi_token_stop_word_is_held_back_until_it_completes_or_fails() -> None:
    stops = StopTokens([[8, 9, 10]])
    assert stops.feed([1, 8]) == [1]
    assert stops.feed([9]) == []
    assert stops.feed([11]) == [8, 9, 11]  # not the word after all
    assert stops.feed([8, 9, 8, 9, 10, 12]) == [8, 9]
    assert stops.stopped and stops.consumed == 9


def test_held_tokens_are_flushed_at_the_end() -> None:
    stops = StopTokens([[3, 4]])
    assert stops.feed([1, 3]) == [1]
    assert stops.flush() == [3] and not stops.stopped
