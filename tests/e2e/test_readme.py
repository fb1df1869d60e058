"""The README's Python examples, run as written against the session stack (its edge in place of
http://127.0.0.1:5100): each prints what the comment beside its `print` says. The first streams a chat
answer and embeds; the second has a pydantic model parsed by `chat.completions.parse` and a tool call,
enforced by the TensorRT-LLM demo LLM's guided decoding."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from launcher.stack import LocalStack

README = Path(__file__).parents[2] / "README.md"
EXAMPLES = re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.S | re.M)


def promised(example: str) -> list[str]:
    """The output the README promises: the comment after each `print(...)`."""
    return re.findall(r"^print\(.*\)  # (.*)$", example, flags=re.M)


@pytest.mark.parametrize("example", EXAMPLES, ids=[f"example-{i + 1}" for i in range(len(EXAMPLES))])
def test_the_readme_example_prints_what_it_says(stack: LocalStack, example: str) -> None:
    assert promised(example), "every example shows its output"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(example.replace("http://127.0.0.1:5100", stack.edge_url), str(README), "exec"), {})
    assert out.getvalue().splitlines() == promised(example)


def test_the_readme_shows_structured_output_and_a_tool_call() -> None:
    assert len(EXAMPLES) == 2
    assert "client.chat.completions.parse(" in EXAMPLES[1] and "tool_choice=" in EXAMPLES[1]
