"""Loading a model folder's tokenizer (and chat template) with transformers, without torch."""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from tritongate.config import ConfigError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def keep_torch_out() -> None:
    """Services only tokenize: with torch kept out of the process, transformers skips it (and imports
    in a third of the time). Called by a service process before anything imports transformers."""
    if "torch" not in sys.modules:
        sys.modules["torch"] = None  # type: ignore[assignment]
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # no "PyTorch was not found" notice


def load_tokenizer(path: str, model: str) -> PreTrainedTokenizerBase:
    """The folder's tokenizer (and chat template)."""
    from transformers import AutoTokenizer

    if not os.path.isdir(path):
        raise ConfigError(f"model `{model}`: `path` {path} is not a folder (run `tritongate models fetch`?)")
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model `{model}`: cannot load a tokenizer from {path}: {exc}") from None


def text_encoder(tokenizer: PreTrainedTokenizerBase, side: str | None, max_length: int
                 ) -> Callable[[list[str]], list[list[int]]]:
    """Texts → token ids, special tokens added, as `tokenizer(texts, truncation=side is not None,
    max_length=max_length)["input_ids"]` gives them, cut on `side` ("right" keeps the start, "left" the
    end; None: not cut); for a fast tokenizer straight from a copy of its Rust tokenizer set up once, which
    costs a fraction of the wrapper's per-call work."""
    if not getattr(tokenizer, "is_fast", False):
        def slow(texts: list[str]) -> list[list[int]]:
            if side is not None:
                tokenizer.truncation_side = side
            return tokenizer(texts, truncation=side is not None, max_length=max_length)["input_ids"]
        return slow
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())  # a copy: the wrapper re-configures its own
    backend.no_padding()
    if side is not None:
        backend.enable_truncation(max_length, direction=side)
    else:
        backend.no_truncation()
    encode = getattr(backend, "encode_batch_fast", backend.encode_batch)  # no offsets (tokenizers >= 0.21)
    return lambda texts: [encoding.ids for encoding in encode(texts)]


# Tokens a prefix cache keeps per tokenizer (int32: 4 bytes each), a few dozen long conversations' prompts.
PREFIX_CACHE_TOKENS = 4_000_000
# Shorter texts are tokenized whole: looking up and keeping their prefixes would cost more than it saves.
PREFIX_CACHE_MIN_CHARS = 2048
# Texts a cut token must split cleanly (a tokenizer that treats the start of its input apart, such as
# Metaspace's prepend_scheme "first", fails them: its cut tokens are not used).
_PROBES = ("x", " x", "\nx", "  x y", "1.5", "Ünïcode ✓", "\n\n", "x\n", ".")


class PrefixCache:
    """Token ids of texts that start with an earlier text, as `tokenizer.encode(text, add_special_tokens=
    False)` gives them, without tokenizing the earlier part again: a conversation's next turn through its
    chat template starts with the previous turn's prompt.

    A fast tokenizer splits its input at special tokens before anything else and tokenizes the pieces
    apart, so the ids of a text are the ids of its part up to the end of a special token followed by
    those of the rest. Those cuts are only taken after the tokenizer's special tokens that split cleanly:
    not normalized, stripping no whitespace after them, no part of a longer added token, and checked on
    probe texts at start. The ids of the text up to its last cut are kept, keyed by a hash of that text,
    at most `max_tokens` in all, the least recently used dropped first; a later text takes the longest
    kept prefix it starts with. A tokenizer without such a token, and a short text, get plain `encode`."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_tokens: int = PREFIX_CACHE_TOKENS,
                 min_chars: int = PREFIX_CACHE_MIN_CHARS) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.min_chars = min_chars
        self.cuts = _clean_cuts(tokenizer)  # their text → their id
        self.pattern = re.compile("|".join(map(re.escape, sorted(self.cuts, key=len, reverse=True))))
        self.cut_ids = frozenset(self.cuts.values())
        self.kept: OrderedDict[bytes, array[int]] = OrderedDict()
        self.tokens = 0
        self.lock = threading.Lock()

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def encode(self, text: str) -> list[int]:
        if not self.cuts or len(text) < self.min_chars:
            return self._encode(text)
        ends, digests = [], []  # each cut's position and the hash of the text before it
        digest = hashlib.blake2b(digest_size=16)
        done = 0
        for match in self.pattern.finditer(text):
            digest.update(text[done:match.end()].encode("utf-8", "surrogatepass"))
            done = match.end()
            ends.append(done)
            digests.append(digest.copy().digest())
        hit, head = len(ends), None  # the kept prefix's cut, its ids
        with self.lock:
            for i in reversed(range(len(ends))):
                head = self.kept.get(digests[i])
                if head is not None:
                    self.kept.move_to_end(digests[i])
                    hit = i
                    break
        start = ends[hit] if head is not None else 0
        first = hit + 1 if head is not None else 0  # the rest's first cut
        rest = self._encode(text[start:])  # one call: the tokenizer's own cost per call is paid once
        if first < len(ends):  # keep the ids up to the last cut, which end with its token's id
            where = [i for i, token in enumerate(rest) if token in self.cut_ids]
            if len(where) == len(ends) - first:  # one id per cut, none from elsewhere
                kept = array("i", head if head is not None else ())
                kept.extend(rest[: where[-1] + 1])
                self._keep(digests[-1], kept)
        return (head.tolist() if head is not None else []) + rest

    def _keep(self, key: bytes, values: array[int]) -> None:
        if len(values) > self.max_tokens:
            return
        with self.lock:
            old = self.kept.pop(key, None)
            self.tokens += len(values) - (len(old) if old is not None else 0)
            self.kept[key] = values
            while self.tokens > self.max_tokens:
                _, dropped = self.kept.popitem(last=False)
                self.tokens -= len(dropped)


def _clean_cuts(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """The special tokens after which a text can be cut (PrefixCache), with their ids."""
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "split_special_tokens", False):
        return {}
    added = {str(token.content): (int(token_id), token)
             for token_id, token in getattr(tokenizer, "added_tokens_decoder", {}).items()}
    candidates = [(content, token_id) for content, (token_id, token) in added.items()
                  if content and token.special and not token.normalized and not token.rstrip
                  and not token.single_word and not any(content in other for other in added if other != content)]
    if not candidates:
        return {}
    # All the probes in one batch: a model may have hundreds of special tokens.
    endings = ("", *_PROBES)
    texts = [*_PROBES, *(f"a{content}{ending}" for content, _ in candidates for ending in endings)]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    alone, rows = ids[: len(_PROBES)], ids[len(_PROBES):]
    cuts = {}
    for n, (content, token_id) in enumerate(candidates):
        head, *probed = rows[n * len(endings): (n + 1) * len(endings)]
        if all(list(row) == list(head) + list(probe) for row, probe in zip(probed, alone, strict=True)):
            cuts[content] = token_id
    return cuts
