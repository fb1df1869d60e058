"""Where a completion ends: stop strings matched on the decoded text, and stop words given as token ids
(the end id, `model_infos` `stop_words`) matched on the generated tokens.

Both matchers hold back what might be the beginning of a stop, so nothing of a stop ever goes out,
even when it is split across tokens or across responses. Before `min_tokens` tokens a stop does not end
the completion (as in vLLM): token words are not matched, and text is fed "unarmed" (passed on, with only
the possible beginning of a stop held back).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class StopStrings:
    """Stop strings in streamed text: `feed` returns the text that can go out now. When a stop string
    completes, `stopped` is set and the text before its start (through its end with `include`) is the
    last text returned; `end` is then where the stop string ends in all the text fed. The stop that
    completes first in the text wins, however the text was split into pieces; `matched` is that stop."""

    def __init__(self, stops: Iterable[str], include: bool = False) -> None:
        self.stops = sorted({stop for stop in stops if stop})
        self.longest = max((len(stop) for stop in self.stops), default=0)
        self.include = include
        self.pending = ""
        self.stopped = False
        self.fed = 0  # characters fed so far
        self.end = 0
        self.matched = ""

    def feed(self, text: str, armed: bool = True) -> str:
        self.fed += len(text)
        if not self.stops or self.stopped:
            return "" if self.stopped else text
        buffer = self.pending + text
        hits = [(index + len(stop), index) for stop in self.stops if (index := buffer.find(stop)) >= 0]
        if hits and armed:
            self.stopped = True
            self.pending = ""
            end, start = min(hits)
            self.end = self.fed - len(buffer) + end
            self.matched = buffer[start:end]
            return buffer[: end if self.include else start]
        keep = self._partial_length(buffer)
        self.pending = buffer[len(buffer) - keep:]
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        """The text held back at the end of generation (it did not become a stop string)."""
        text, self.pending = self.pending, ""
        return text

    def _partial_length(self, buffer: str) -> int:
        """Length of the longest end of `buffer` that begins some stop string."""
        for size in range(min(self.longest - 1, len(buffer)), 0, -1):
            tail = buffer[-size:]
            if any(stop.startswith(tail) for stop in self.stops):
                return size
        return 0


class StopTokens:
    """Token-id stop words: `feed` returns the tokens that can be decoded now. When the generated tokens
    end with a stop word (at `min_tokens` tokens or later), `stopped` is set and the word's tokens are
    dropped (FasterTransformer leaves them in its output). `consumed` counts every token fed until then."""

    def __init__(self, words: Iterable[Sequence[int]], min_tokens: int = 0) -> None:
        self.words = sorted({tuple(word) for word in words if word}, key=len)
        self.longest = max((len(word) for word in self.words), default=0)
        self.min_tokens = min_tokens
        self.pending: list[int] = []
        self.stopped = False
        self.consumed = 0

    def feed(self, tokens: Iterable[int]) -> list[int]:
        released: list[int] = []
        for token in tokens:
            if self.stopped:
                break
            self.consumed += 1
            self.pending.append(token)
            word = None if self.consumed < self.min_tokens else \
                next((w for w in self.words if tuple(self.pending[-len(w):]) == w), None)
            if word is not None:
                self.stopped = True
                released += self.pending[: len(self.pending) - len(word)]
                self.pending = []
                break
            keep = self._partial_length()
            released += self.pending[: len(self.pending) - keep]
            self.pending = self.pending[len(self.pending) - keep:]
        return released

    def flush(self) -> list[int]:
        tokens, self.pending = self.pending, []
        return tokens

    def _partial_length(self) -> int:
        for size in range(min(self.longest - 1, len(self.pending)), 0, -1):
            tail = tuple(self.pending[-size:])
            if any(word[:size] == tail for word in self.words):
                return size
        return 0
