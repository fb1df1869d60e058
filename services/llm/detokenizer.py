"""Token ids → text, incrementally, as tokens stream in."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

REPLACEMENT = "\ufffd"  # what a decoder makes of an incomplete UTF-8 sequence
CONTEXT_TOKENS = 5

Decode = Callable[[list[int]], str]


class Detokenizer:
    """Turns a stream of token ids into text deltas that concatenate to the decoded text: never half a
    UTF-8 character (byte-level tokens can split one), never a character twice or not at all.

    Each token decodes a short window: the tokens of the last emitted delta plus the new ones. While
    the window's text ends in U+FFFD, or adds nothing, the new tokens wait for the next. The window
    starts with the last prompt tokens, so that decoders which drop a leading space (SentencePiece)
    see the first generated token in context.
    """

    def __init__(self, decode: Decode, context: Sequence[int] = ()) -> None:
        self.decode = decode
        window = list(context[-CONTEXT_TOKENS:])
        while window and decode(window).endswith(REPLACEMENT):  # the prompt ends inside a character
            window.pop()
        self.tokens = window
        self.prefix = 0  # where the window starts
        self.read = len(window)  # tokens before this are in the emitted text
        self.prefix_text = decode(window) if window else ""

    def add(self, token: int) -> str:
        """The text `token` completes ("" while it waits for more)."""
        self.tokens.append(token)
        text = self.decode(self.tokens[self.prefix:])
        if len(text) <= len(self.prefix_text) or text.endswith(REPLACEMENT):
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Whatever is still waiting when generation ends (an incomplete character becomes U+FFFD)."""
        if self.read == len(self.tokens):
            return ""
        text = self.decode(self.tokens[self.prefix:])
        return self._advance(text) if len(text) > len(self.prefix_text) else ""

    def _advance(self, text: str) -> str:
        delta = text[len(self.prefix_text):]
        self.prefix, self.read = self.read, len(self.tokens)
        self.prefix_text = self.decode(self.tokens[self.prefix:self.read])
        if self.prefix > 64:  # keep the list short on long generations
            del self.tokens[: self.prefix]
            self.read -= self.prefix
            self.prefix = 0
        return delta


def text_decoder(tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool = True) -> Decode:
    """Decode without special tokens (or with them); straight through the Rust tokenizer when there is one."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return lambda ids: str(backend.decode(ids, skip_special_tokens=skip_special_tokens))
    return lambda ids: str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens,
                                            clean_up_tokenization_spaces=False))


def _byte_level_table() -> dict[str, int]:
    """GPT-2's byte ↔ printable character table, inverted (byte-level BPE vocabularies use it)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


class TokenText:
    """A single token as text and as bytes, for log probabilities."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        backend: Any = getattr(tokenizer, "backend_tokenizer", None)
        decoder = getattr(backend, "decoder", None)
        self.byte_level = type(decoder).__name__ == "ByteLevel"
        self.table = _byte_level_table() if self.byte_level else {}
        self.special = set(tokenizer.all_special_ids)

    def text(self, token: int) -> str:
        return str(self.tokenizer.decode([token], skip_special_tokens=False))

    def bytes(self, token: int) -> bytes:
        if self.byte_level and token not in self.special:
            piece = self.tokenizer.convert_ids_to_tokens(token)
            if isinstance(piece, str) and all(char in self.table for char in piece):
                return bytes(self.table[char] for char in piece)
        text = self.text(token)
        return b"" if REPLACEMENT in text else text.encode("utf-8")


@dataclass(frozen=True)
class TokenDecoding:
    """How one model's tokens become text: incrementally (completions; `decode_special` keeps special
    tokens, for `skip_special_tokens: false`) and one by one (log probabilities); and how many tokens a
    text is (completions of backends that stream text without counting its tokens)."""

    decode: Decode
    token_text: TokenText
    decode_special: Decode
    count: Callable[[str], int]

    @classmethod
    def of(cls, tokenizer: PreTrainedTokenizerBase) -> TokenDecoding:
        return cls(text_decoder(tokenizer), TokenText(tokenizer), text_decoder(tokenizer, skip_special_tokens=False),
                   lambda text: len(tokenizer.encode(text, add_special_tokens=False)) if text else 0)
