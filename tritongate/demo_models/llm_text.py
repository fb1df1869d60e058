"""Text for the demo LLM models with text interfaces (TensorRT-LLM's ensemble, vLLM): the tokenizer and
incremental detokenization. Runs inside Triton's Python backend (see llm_core)."""

from __future__ import annotations

from typing import Any

from tritongate.demo_models.llm_core import model_path


def load_tokenizer() -> Any:
    """The demo LLM's tokenizer (from the same folder as its weights)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path())


class IncrementalDecoder:
    """The text of a growing list of token ids, handed out as deltas that never end inside a UTF-8
    character: a token that holds only the first bytes of a character yields nothing until the token
    that completes it (the prefix/read offsets of TGI and vLLM's incremental detokenizers)."""

    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] were decoded last time, as context for the next delta
        self.read = 0  # ids before this are out as text

    def add(self, ids: list[int]) -> str:
        """Append `ids`; return the text they complete."""
        self.ids.extend(ids)
        return self._delta(final=False)

    def flush(self) -> str:
        """The text still held back (an incomplete character, as U+FFFD); call once, at the end."""
        return self._delta(final=True)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens))

    def _delta(self, final: bool) -> str:
        if self.read == len(self.ids):
            return ""
        before = self._decode(self.ids[self.prefix:self.read])
        after = self._decode(self.ids[self.prefix:])
        if len(after) > len(before) and (final or not after.endswith("\ufffd")):
            self.prefix, self.read = self.read, len(self.ids)
            return after[len(before):]
        if final:
            self.prefix = self.read = len(self.ids)
        return ""
