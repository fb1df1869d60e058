"""What the llm service's own work costs per long chat request: the chat template, and the tokenization of
what it renders, tokenized whole (before) and through the prefix cache of services/common/tokenizer.py
(after: a conversation's next turn tokenizes only what the previous one did not have), alternated in
one run, in this process.

    python bench/long_prompts.py [--sizes 8000,16000,24000,32000,40000] [--repeats 20] > result.json

For each prompt size: a conversation of bench/multiturn.py's shape whose last turn's prompt has about
that many tokens, through the demo LLM's chat template (the service's sandboxed renderer); then, each
repeat, `before` (tokenizer.encode of the whole text) and `after` (a fresh cache that has seen the
previous turn, then this turn; and `after_cold`, a fresh cache's first sight of the text) in turn, the
order swapped every repeat. Medians in milliseconds; the ids are checked equal every time.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.multiturn import TOKENIZER, Shape, Words, conversation
from services.common.tokenizer import PrefixCache
from services.llm.chat import load_chat_template
from tritongate.settings import default_models_dir


def timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    value = call()
    return (time.perf_counter() - start) * 1000, value


def turns_for(tokens: int, words: Words, system: str) -> list[dict[str, str]]:
    """The messages of a conversation whose last prompt has about `tokens` tokens (all its turns, replies
    included, as the client sends them)."""
    shape = Shape(shared_tokens=2000, prompt_tokens=(tokens - 4000, tokens), turns=(10, 10), growth=400,
                  reply_tokens=64)
    talk = conversation(tokens, shape, words, system)
    messages = [{"role": "system", "content": talk.system}]
    for i, user in enumerate(talk.users):
        if i:
            messages.append({"role": "assistant", "content": words.text(random.Random(i), shape.reply_tokens)})
        messages.append({"role": "user", "content": user})
    return messages


def measure(tokenizer: Any, template: Any, messages: list[dict[str, str]], repeats: int) -> dict[str, Any]:
    previous = template.render(messages[:-2], add_generation_prompt=True)
    render_ms, text = timed(lambda: template.render(messages, add_generation_prompt=True))
    expected = list(tokenizer.encode(text, add_special_tokens=False))
    samples: dict[str, list[float]] = {"template": [render_ms], "before": [], "after": [], "after_cold": []}
    for repeat in range(repeats):
        order = ("before", "after", "after_cold") if repeat % 2 == 0 else ("after_cold", "after", "before")
        for mode in order:
            if mode == "before":
                spent, ids = timed(lambda: list(tokenizer.encode(text, add_special_tokens=False)))
            else:
                cache = PrefixCache(tokenizer)
                if mode == "after":
                    cache.encode(previous)  # the previous turn, seen by this replica
                spent, ids = timed(lambda cache=cache: cache.encode(text))
            if ids != expected:
                raise AssertionError(f"{mode}: ids differ from a whole tokenization")
            samples[mode].append(spent)
        samples["template"].append(timed(lambda: template.render(messages, add_generation_prompt=True))[0])
    result: dict[str, Any] = {"prompt_tokens": len(expected), "messages": len(messages)}
    result.update({f"{mode}_ms": round(statistics.median(values), 3) for mode, values in samples.items()})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="8000,16000,24000,32000,40000", help="prompt sizes in tokens")
    parser.add_argument("--repeats", type=int, default=20, help="measurements per size and way")
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(str(default_models_dir() / TOKENIZER))
    template = load_chat_template(tokenizer, None, TOKENIZER)
    words = Words(tokenizer)
    system = "You are a coding agent. " + words.text(random.Random(-1), 2000)
    rows = []
    for size in (int(n) for n in args.sizes.split(",")):
        row = measure(tokenizer, template, turns_for(size, words, system), args.repeats)
        print(row, file=sys.stderr, flush=True)
        rows.append(row)
    print(json.dumps({"benchmark": "long_prompts", "repeats": args.repeats, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
