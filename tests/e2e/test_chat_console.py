"""`tritongate chat` in a real terminal (a pseudo-terminal driven by pexpect) against the test stack:
the answer streams, the conversation is kept, /system, /reset and /model work, and Ctrl-C stops the
answer (and the request inside Triton) but not the program."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from launcher.stack import LocalStack
from tests.support.events import events_offset, read_events
from tests.support.ports import wait_until

ECHO = "ft-echo"
SLOW = "ft-echo-slow"
PROMPT = "you> "
USAGE = re.compile(r"\[(\d+) prompt \+ (\d+) completion tokens\]")


def open_console(stack: LocalStack, model: str, max_tokens: int, *flags: str) -> pexpect.spawn:
    child = pexpect.spawn(sys.executable, ["-m", "launcher.cli", "chat", "--url", f"{stack.edge_url}/v1", "--model",
                                           model, "--max-tokens", str(max_tokens), *flags], encoding="utf-8",
                          timeout=60, dimensions=(40, 200))
    child.expect(f"tritongate chat with {model}")
    child.expect_exact(PROMPT)
    return child


@pytest.fixture
def console(stack: LocalStack) -> Iterator[pexpect.spawn]:
    child = open_console(stack, ECHO, 8)
    yield child
    child.close(force=True)


def ask(child: pexpect.spawn, text: str) -> tuple[str, int]:
    """Send a question; the answer's text and its prompt tokens."""
    child.sendline(text)
    child.expect(USAGE)
    prompt_tokens = int(child.match.group(1))
    shown = child.before
    child.expect_exact(PROMPT)
    return shown.split(text, 1)[-1].strip(), prompt_tokens


# httpx logs each request at INFO: a line the console must not put into the conversation.
REQUEST_LOG = "HTTP Request: POST"


def test_the_conversation_is_kept_until_reset(console: pexpect.spawn) -> None:
    answer, first = ask(console, "hello")
    assert answer  # ft-echo repeats the prompt's start: SmolLM2's default system message
    assert REQUEST_LOG not in answer and "INFO" not in answer
    _, second = ask(console, "hello")
    assert second > first + 5  # the first exchange is in the second prompt
    console.sendline("/reset")
    console.expect_exact("[conversation reset]")
    console.expect_exact(PROMPT)
    assert ask(console, "hello")[1] == first


def test_system_and_model_commands(console: pexpect.spawn) -> None:
    console.sendline("/system Answer in French.")
    console.expect_exact("[system: Answer in French.]")
    console.expect_exact(PROMPT)
    answer, _ = ask(console, "hello")
    assert "Answer in" in answer  # ft-echo repeats the prompt: the system message now comes first
    console.sendline("/model")
    console.expect_exact(f"* {ECHO}")
    console.expect_exact(PROMPT)
    console.sendline("/model no-such-model")
    console.expect_exact(PROMPT)
    console.sendline("hello")
    console.expect(r"\[error: .*no-such-model")
    console.expect_exact(PROMPT)
    console.sendline(f"/model {ECHO}")
    console.expect_exact(PROMPT)
    assert ask(console, "hello")[0]  # the refused question left the conversation as it was


def test_verbose_shows_the_http_librarys_request_log(stack: LocalStack) -> None:
    console = open_console(stack, ECHO, 4, "--verbose")
    try:
        answer, _ = ask(console, "hello")
        assert REQUEST_LOG in answer
    finally:
        console.close(force=True)


def test_ctrl_c_stops_the_answer_and_the_request_but_not_the_program(stack: LocalStack, events_file: Path) -> None:
    console = open_console(stack, SLOW, 100)
    try:
        _ctrl_c(console, events_file)
    finally:
        console.close(force=True)


def _ctrl_c(console: pexpect.spawn, events_file: Path) -> None:
    # ft-echo-slow repeats the prompt, 50 ms a token: the system message makes it long (some 3 s).
    console.sendline("/system " + "tick tock " * 30)
    console.expect_exact(PROMPT)
    offset = events_offset(events_file)
    console.sendline("hello")
    console.expect("tick tock tick")  # the answer has begun streaming
    console.sendintr()
    console.expect_exact("[cancelled]")
    console.expect_exact(PROMPT)
    wait_until(lambda: any(e["event"] == "cancelled" for e in read_events(events_file, offset)), 10,
               "Triton's request to be cancelled")
    console.sendintr()  # at the prompt: a hint, not an exit
    console.expect_exact("Ctrl-D or /quit to leave")
    console.sendline(f"/model {ECHO}")
    console.expect_exact(PROMPT)
    assert ask(console, "hello")[0]
    console.sendline("/quit")
    console.expect(pexpect.EOF)
