"""Guided decoding for the demo LLMs, with xgrammar: the grammar library TensorRT-LLM
(`guided_decoding_backend: xgrammar`) and vLLM use, so a JSON Schema is enforced on the laptop stack as on
a GPU deployment.

A guide (TensorRT-LLM's `guided_decoding_guide_type` json / json_schema / regex / ebnf_grammar, or vLLM's
`structured_outputs` json / json_object / regex / grammar / choice) compiles once per request into a
grammar; each sequence gets its own matcher, which masks the logits before every choice and advances with
the chosen token. When the grammar is complete only the end id is allowed, so the sequence ends there.
JSON is generated compact (no free whitespace): a small model given free whitespace may emit nothing else.

Runs inside Triton's Python backend (see llm_core): xgrammar and torch are imported when first needed.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from tritongate.demo_models.llm_core import RequestError

KINDS = ("json", "json_schema", "regex", "ebnf_grammar", "choice")


class GrammarCompiler:
    """Compiles guides against one tokenizer (made on first use; compiled grammars are cached)."""

    def __init__(self, path: str, vocab_size: int) -> None:
        self.path, self.vocab_size = path, vocab_size
        self.compiler: Any = None
        self.lock = threading.Lock()

    def _compiler(self) -> Any:
        with self.lock:
            if self.compiler is None:
                import xgrammar
                from transformers import AutoTokenizer

                info = xgrammar.TokenizerInfo.from_huggingface(AutoTokenizer.from_pretrained(self.path),
                                                               vocab_size=self.vocab_size)
                self.compiler = xgrammar.GrammarCompiler(info)
            return self.compiler

    def compile(self, kind: str, guide: str) -> Any:
        """The compiled grammar of a guide; RequestError when the compiler rejects it."""
        if kind not in KINDS:
            raise RequestError(f"guided decoding: unknown guide type {kind!r} (expected one of {', '.join(KINDS)})")
        compiler = self._compiler()
        try:
            if kind == "json":
                return compiler.compile_builtin_json_grammar()
            if kind == "json_schema":
                return compiler.compile_json_schema(guide, any_whitespace=False)
            if kind == "regex":
                return compiler.compile_regex(guide)
            if kind == "choice":
                choices = json.loads(guide)
                return compiler.compile_regex("|".join(_regex_literal(choice) for choice in choices))
            return compiler.compile_grammar(guide)
        except (RuntimeError, ValueError, TypeError) as exc:
            first = str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc)
            raise RequestError(f"guided decoding: the {kind} guide does not compile: {first}") from None


class Matcher:
    """One sequence's place in its grammar."""

    def __init__(self, grammar: Any, torch: Any) -> None:
        import xgrammar

        self.xgrammar, self.torch = xgrammar, torch
        self.matcher = xgrammar.GrammarMatcher(grammar)
        self.bitmask = xgrammar.allocate_token_bitmask(1, grammar.tokenizer_info.vocab_size)

    def mask(self, logits: Any) -> Any:
        """`logits` [vocab] with every token the grammar forbids at -inf."""
        self.matcher.fill_next_token_bitmask(self.bitmask)
        rows = logits.unsqueeze(0).clone()
        self.xgrammar.apply_token_bitmask_inplace(rows, self.bitmask)
        return rows[0]

    def accept(self, token: int) -> None:
        if not self.matcher.is_terminated() and not self.matcher.accept_token(token):
            raise RuntimeError(f"guided decoding: token {token} does not fit the grammar")

    @property
    def complete(self) -> bool:
        return bool(self.matcher.is_terminated())


def _regex_literal(text: str) -> str:
    return "".join("\\" + c if c in ".^$*+?()[]{}|\\/-" else c for c in str(text))
