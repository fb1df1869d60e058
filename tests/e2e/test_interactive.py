"""POST /v1/chat/interactive on the whole stack, with the request LMDeploy's `APIClient.chat_interactive_v1`
sends and its way of reading the answer (JSON lines): history kept across turns, `interactive_mode: false`
ending the session, cancel, and the session limits (on an edge of their own)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from launcher.stack import LocalStack, http_ok
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn

ECHO = "ft-echo"
SLOW = "ft-echo-slow"


def lmdeploy_payload(prompt: str | list[dict[str, str]], session_id: int, interactive_mode: bool, stream: bool = False,
                     **kwargs: Any) -> dict[str, Any]:
    """The body APIClient.chat_interactive_v1 posts, with its defaults (`model` goes in its kwargs)."""
    return {"prompt": prompt, "image_url": None, "session_id": session_id, "interactive_mode": interactive_mode,
            "stream": stream, "stop": None, "request_output_len": 6, "top_p": 0.8, "top_k": 40, "temperature": 0.8,
            "repetition_penalty": 1.0, "ignore_eos": False, "skip_special_tokens": True, "adapter_name": None,
            "model": ECHO, **kwargs}


def lmdeploy_read(http: httpx.Client, body: dict[str, Any]) -> list[dict[str, Any]]:
    """What APIClient yields: each non-empty line of the answer, as JSON."""
    with http.stream("POST", "/v1/chat/interactive", json=body) as response:
        assert response.status_code == 200, response.read()
        return [json.loads(line) for line in response.read().split(b"\n") if line]


def test_history_grows_by_each_turn_and_interactive_mode_false_ends_the_session(http: httpx.Client) -> None:
    session = 1001
    (first,) = lmdeploy_read(http, lmdeploy_payload("Hello there", session, True))
    assert first["history_tokens"] == 0 and first["input_tokens"] > 0 and first["tokens"] == 6
    assert first["finish_reason"] == "length" and first["text"]
    (second,) = lmdeploy_read(http, lmdeploy_payload("And again", session, True))
    assert second["history_tokens"] == first["history_tokens"] + first["input_tokens"] + first["tokens"]
    lines = lmdeploy_read(http, lmdeploy_payload("Last one", session, False, stream=True))
    # The text in one line or several (tokens that arrive together share a line), then the closing line.
    assert len(lines) >= 2 and lines[-1]["finish_reason"] == "length" and lines[-1]["text"] == ""
    assert all(line["finish_reason"] is None and line["text"] for line in lines[:-1])
    third = lines[-1]
    assert third["history_tokens"] == second["history_tokens"] + second["input_tokens"] + second["tokens"]
    # interactive_mode false answered after the history, then ended the session: the next turn starts afresh.
    (fresh,) = lmdeploy_read(http, lmdeploy_payload("Hello there", session, True))
    assert fresh["history_tokens"] == 0 and fresh["input_tokens"] == first["input_tokens"]
    # LMDeploy's client ends a session with an empty prompt and interactive_mode false.
    (ended,) = lmdeploy_read(http, lmdeploy_payload("", session, False, request_output_len=0))
    assert ended["text"] == "" and ended["history_tokens"] == fresh["input_tokens"] + fresh["tokens"]


# A turn that takes seconds on the slow echo (50 ms a token): it repeats its prompt, and this one reaches its
# end token only after its long system message (with the default system prompt it would end within 1 s).
LONG_TURN = [{"role": "system", "content": "tick tock " * 30}, {"role": "user", "content": "tick tock"}]


def test_cancel_stops_the_request_in_flight(http: httpx.Client) -> None:
    session = 1002
    lines: list[dict[str, Any]] = []

    def turn() -> None:
        lines.extend(lmdeploy_read(http, lmdeploy_payload(LONG_TURN, session, True, stream=True, model=SLOW,
                                                          request_output_len=140)))

    thread = threading.Thread(target=turn)
    thread.start()
    time.sleep(1.0)
    cancelled = http.post("/v1/chat/interactive", json={"prompt": "", "session_id": session, "cancel": True})
    assert cancelled.status_code == 200 and cancelled.json()["text"] == ""
    thread.join(30)
    # The cancel's closing line: no tokens counted (a turn that ended by itself counts its answer's).
    assert not thread.is_alive() and lines and lines[-1]["finish_reason"] == "stop" and lines[-1]["tokens"] == 0
    assert len(lines) < 100


def test_cancel_stops_a_request_that_is_not_streamed(http: httpx.Client) -> None:
    session = 1003
    answers: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answers.append(http.post("/v1/chat/interactive", json=lmdeploy_payload(
        LONG_TURN, session, True, model=SLOW, request_output_len=140))))
    thread.start()
    time.sleep(1.0)
    assert http.post("/v1/chat/interactive", json={"prompt": "", "session_id": session, "cancel": True}).is_success
    thread.join(30)
    assert not thread.is_alive() and answers[0].status_code == 200
    assert answers[0].json()["text"] == "" and answers[0].json()["finish_reason"] == "stop"
    # The cancelled turn left the session as it was: empty.
    (after,) = lmdeploy_read(http, lmdeploy_payload("hi", session, False, model=SLOW, request_output_len=1))
    assert after["history_tokens"] == 0


BAD = [
    ("session id not an integer", {"session_id": "abc"}, 400, "session_id"),
    ("session id a float", {"session_id": 1.5}, 400, "session_id"),
    ("unknown model", {"model": "no-such-model"}, 404, "model"),
    ("negative output length", {"request_output_len": -1}, 400, "request_output_len"),
    ("no output", {"request_output_len": 0}, 400, "request_output_len"),
    ("seed out of range", {"seed": 2**64}, 400, "seed"),
    ("cancel without a session", {"cancel": True, "session_id": -1}, 400, "session_id"),
]


@pytest.mark.parametrize(("case", "change", "status", "param"), BAD, ids=[b[0] for b in BAD])
def test_bad_input(http: httpx.Client, case: str, change: dict[str, Any], status: int, param: str) -> None:
    response = http.post("/v1/chat/interactive", json={**lmdeploy_payload("hi", 7, True), **change})
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def session_model(http: httpx.Client, session: int) -> str:
    """The model a session talks to, as a turn naming another model is told."""
    wrong = http.post("/v1/chat/interactive", json=lmdeploy_payload("hi", session, True, model="vllm-echo"))
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model", wrong.text
    return wrong.json()["error"]["message"].split("`")[1]


def test_a_request_naming_no_model_goes_to_the_first_llm_listed(http: httpx.Client) -> None:
    """LMDeploy's client never sends `model`: with no default configured, the first LLM of /v1/models."""
    (turn,) = lmdeploy_read(http, lmdeploy_payload("Hi", 2001, True, model=None, request_output_len=1))
    assert turn["tokens"] == 1
    first = next(m["id"] for m in http.get("/v1/models").json()["data"] if m["permission"][0]["allow_sampling"])
    assert session_model(http, 2001) == first


@pytest.fixture(scope="module")
def small_edge(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    """An edge on the stack's services with room for 2 sessions of at most 40 tokens, and a default LLM."""
    port = free_port()
    address = stack.service_address
    env = dict(os.environ, TRITONGATE_INTERACTIVE_MAX_SESSIONS="2", TRITONGATE_INTERACTIVE_MAX_SESSION_TOKENS="40",
               TRITONGATE_DEFAULT_LLM=SLOW)
    log: Path = tmp_path_factory.mktemp("small-edge") / "edge.log"
    process = spawn(["edge", "--port", str(port), f"--llm={address('llm')}", f"--embed={address('embed')}",
                     f"--rerank={address('rerank')}"], env, log)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/health"), 60, "the edge", process)
        with httpx.Client(base_url=url, timeout=60) as client:
            yield client
    finally:
        process.terminate()
        process.wait(30)


def test_a_session_over_its_token_budget_must_be_ended(small_edge: httpx.Client) -> None:
    (first,) = lmdeploy_read(small_edge, lmdeploy_payload("one two three four", 1, True, request_output_len=40))
    assert first["input_tokens"] + first["tokens"] >= 40
    over = small_edge.post("/v1/chat/interactive", json=lmdeploy_payload("more", 1, True))
    assert over.status_code == 400
    error = over.json()["error"]
    assert error["param"] == "session_id" and error["code"] == "session_too_long" and "40" in error["message"]
    (ended,) = lmdeploy_read(small_edge, lmdeploy_payload("", 1, False, request_output_len=0))
    assert ended["finish_reason"] == "stop"
    (again,) = lmdeploy_read(small_edge, lmdeploy_payload("hi", 1, False))  # (and ended at once)
    assert again["history_tokens"] == 0


def test_the_configured_default_llm_answers_requests_naming_none(small_edge: httpx.Client) -> None:
    assert small_edge.get("/v1/models").json()["data"][0]["id"] == SLOW  # listed first, for clients that pick it
    lmdeploy_read(small_edge, lmdeploy_payload("hi", 21, True, model=None, request_output_len=1))
    assert session_model(small_edge, 21) == SLOW
    lmdeploy_read(small_edge, lmdeploy_payload("", 21, False, request_output_len=0))


def test_too_many_sessions(small_edge: httpx.Client) -> None:
    for session in (11, 12):
        lmdeploy_read(small_edge, lmdeploy_payload("hi", session, True))
    refused = small_edge.post("/v1/chat/interactive", json=lmdeploy_payload("hi", 13, True))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_sessions"
    lmdeploy_read(small_edge, lmdeploy_payload("", 11, False, request_output_len=0))  # end one: room again
    assert small_edge.post("/v1/chat/interactive", json=lmdeploy_payload("hi", 13, True)).status_code == 200

