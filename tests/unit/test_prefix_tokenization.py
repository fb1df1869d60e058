"""The prefix cache of rendered chats (services/common/tokenizer.py PrefixCache): the ids are always those of
tokenizing the whole text, and a conversation's next turn tokenizes only what the previous one did not have."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from services.common.tokenizer import PrefixCache
from services.llm.chat import load_chat_template

PIECES = ("hello", " world", "\n", "  ", "Ünïcode ✓", "12.5", "def f(x):\n    return x", "<|im_start|>",
          "<|im_end|>", "<|endoftext|>", "im_start", "<|im_", "|>", "\n\n", " ", "tab\there", "émoji 🙂")


def full(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


class Counting(PrefixCache):
    """Records the characters it tokenizes itself."""

    tokenized = 0

    def _encode(self, text: str) -> list[int]:
        self.tokenized += len(text)
        return super()._encode(text)


def conversation(turns: int, rng: random.Random) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a helpful agent.\n" + " ".join(
        rng.choice(PIECES) for _ in range(300))}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"turn {i}: " + "".join(rng.choice(PIECES) for _ in range(80))})
        messages.append({"role": "assistant", "content": "".join(rng.choice(PIECES) for _ in range(20))})
    return messages


def test_a_conversations_turns_tokenize_as_a_whole_and_only_what_is_new(tokenizer: Any) -> None:
    template = load_chat_template(tokenizer, None, "smollm2")
    assert template is not None
    cache = Counting(tokenizer, min_chars=0)
    assert "<|im_start|>" in cache.cuts and "<|im_end|>" in cache.cuts
    messages = conversation(12, random.Random(1))
    previous = ""
    for turn in range(1, 13):
        text = template.render(messages[: 2 * turn], add_generation_prompt=True)
        cache.tokenized = 0
        assert cache.encode(text) == full(tokenizer, text)
        if previous:
            assert text.startswith(previous)
            assert cache.tokenized <= len(text) - len(previous) + len("<|im_start|>assistant\n")
        previous = text
    assert cache.encode(previous) == full(tokenizer, previous)  # the same prompt again (a retry)


def test_any_text_tokenizes_as_a_whole(tokenizer: Any) -> None:
    cache = PrefixCache(tokenizer, min_chars=0)
    rng = random.Random(2)
    texts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(0, 60))) for _ in range(300)]
    for text in texts + [a + b for a, b in zip(texts, reversed(texts), strict=True)]:
        assert cache.encode(text) == full(tokenizer, text), text


def test_the_kept_ids_stay_within_their_bound(tokenizer: Any) -> None:
    cache = PrefixCache(tokenizer, max_tokens=300, min_chars=0)
    rng = random.Random(3)
    for _ in range(50):
        text = "<|im_start|>" + "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 80))) + "<|im_end|>x"
        assert cache.encode(text) == full(tokenizer, text)
        assert cache.tokens <= 300
        assert cache.tokens == sum(len(ids) for ids in cache.kept.values())


def test_the_other_demo_tokenizer_too(models_dir: Path) -> None:
    minilm = AutoTokenizer.from_pretrained(models_dir / "all-minilm-l6-v2")
    cache = PrefixCache(minilm, min_chars=0)
    rng = random.Random(4)
    for _ in range(100):
        text = "".join(rng.choice((*PIECES, "[SEP]", "[CLS]", " [SEP] ", "[PAD]")) for _ in range(40))
        assert cache.encode(text) == full(minilm, text)
        assert cache.encode(text + "[SEP] more") == full(minilm, text + "[SEP] more")


def metaspace_first() -> PreTrainedTokenizerFast:
    """A tokenizer that marks only the start of its whole input (Llama 2's and Mistral's Metaspace
    prepend_scheme "first"): a piece tokenized apart would start differently."""
    vocab = {"[UNK]": 0, "<s>": 1, "</s>": 2, "▁a": 3, "a": 4, "▁x": 5, "x": 6, "▁b": 7, "b": 8}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="[UNK]")


def test_a_tokenizer_that_treats_the_start_apart_is_not_cut() -> None:
    tokenizer = metaspace_first()
    assert full(tokenizer, "a</s>x") != full(tokenizer, "a</s>") + full(tokenizer, "x")
    cache = PrefixCache(tokenizer, min_chars=0)
    assert cache.cuts == {}
    for text in ("a</s>x", "a b</s>x a", "</s>a", "x"):
        assert cache.encode(text) == full(tokenizer, text)
        assert cache.encode(text) == full(tokenizer, text)


@pytest.mark.parametrize("text", ["", "<|im_start|>", "no special token at all", "<|im_end|><|im_end|>"])
def test_edges(tokenizer: Any, text: str) -> None:
    cache = PrefixCache(tokenizer, min_chars=0)
    assert cache.encode(text) == full(tokenizer, text)
    assert cache.encode(text) == full(tokenizer, text)


def test_a_short_text_is_tokenized_whole_and_not_kept(tokenizer: Any) -> None:
    cache = PrefixCache(tokenizer)
    short = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"
    assert cache.encode(short) == full(tokenizer, short)
    assert not cache.kept
    long = short + "word " * 1000 + "<|im_end|>\n<|im_start|>assistant\n"
    assert cache.encode(long) == full(tokenizer, long)
    assert cache.kept


def test_the_kept_ids_are_those_of_the_text_up_to_its_last_cut(tokenizer: Any) -> None:
    template = load_chat_template(tokenizer, None, "smollm2")
    assert template is not None
    cache = PrefixCache(tokenizer, min_chars=0)
    messages = conversation(3, random.Random(5))
    for turn in (1, 2, 3):  # a miss, then hits
        text = template.render(messages[: 2 * turn], add_generation_prompt=True)
        cache.encode(text)
        last = text.rindex("<|im_start|>") + len("<|im_start|>")
        assert list(next(reversed(cache.kept.values()))) == full(tokenizer, text[:last])
