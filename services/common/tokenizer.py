"""Loading a model folder's tokenizer (and chat template) with transformers, without torch."""

from __future__ import annotations

import os
import sys
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
