"""Loading a model folder's tokenizer (and chat template) with transformers, without torch."""

from __future__ import annotations

import os
import sys
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
