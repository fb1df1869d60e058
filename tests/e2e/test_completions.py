"""/v1/completions end to end: HTTP and the openai SDK → edge → llm service → real Triton, on every
Triton LLM interface (the `backend` fixture: one echo model per interface, tests.support.backends).

Exact text comes from the echo models (their continuation repeats the prompt's tokens) with SmolLM2's
byte-level tokenizer, so stops split across tokens and characters split across tokens happen for real.
Tests of exact chunk boundaries use the echo paced at 50 ms per response (`<model>-slow`): the llm
service joins the increments a lagging reader has not taken yet into one message, so at full speed a
chunk may hold several tokens.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from launcher.stack import LocalStack, http_ok
from tests.support.backends import EchoBackend
from tests.support.events import events_offset, read_events
from tests.support.openai_schema import validate
from tests.support.ports import free_port, wait_until
from tests.support.stack import spawn as _spawn
from tests.support.streams import stream_chunks, stream_events, validate_completion_chunk

ECHO = "ft-echo"
SLOW = "ft-echo-slow"  # 50 ms per token: one chunk per token
END_ID = 2
# Room left after a stop: the llm service cancels the Triton request when it matches a stop string, and a
# cancellation that races the request's own completion can crash Triton 2.51, the embedded one
# (triton-inference-server/server#7840, fixed in 24.12). Far from the end, the model sees it mid-generation.
ROOM = 100


@pytest.fixture(scope="module")
def tokenizer(models_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(models_dir / "smollm2-135m-instruct")


def ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def complete(http: httpx.Client, model: str, **body: Any) -> dict[str, Any]:
    response = http.post("/v1/completions", json={"model": model, **body})
    assert response.status_code == 200, response.text
    result = response.json()
    validate(result, "CreateCompletionResponse")
    assert "system_fingerprint" not in result
    return result


def chunks(http: httpx.Client, model: str, **body: Any) -> list[dict[str, Any]]:
    result = stream_chunks(http, "/v1/completions", {"model": model, "stream": True, **body})
    for chunk in result:
        validate_completion_chunk(chunk)
        assert chunk["object"] == "text_completion" and chunk["id"] == result[0]["id"]
    return result


def texts_and_reasons(result: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in result]


def paced_chunks(http: httpx.Client, backend: EchoBackend, **body: Any) -> list[tuple[str, str | None]]:
    """Texts and finish reasons of the paced model's chunks, one per token. At full speed the same text
    must come, perhaps in fewer chunks, never with half a character."""
    paced = texts_and_reasons(chunks(http, backend.slow, **body))
    fast = texts_and_reasons(chunks(http, backend.model, **body))
    assert "".join(text for text, _ in fast) == "".join(text for text, _ in paced)
    assert fast[-1] == paced[-1] and all("\ufffd" not in text for text, _ in fast)
    return paced


@pytest.mark.parametrize(("stop", "streamed", "text"), [
    ([" STOP"], ["The", " END", "."], "The END."),  # ' STOP' is the tokens ' ST' + 'OP'
    (["D. S"], ["The", " EN"], "The EN"),  # across three tokens, starting inside one
])
def test_stop_strings_split_across_tokens(http: httpx.Client, tokenizer: Any, backend: EchoBackend, stop: list[str],
                                          streamed: list[str], text: str) -> None:
    prompt = ids(tokenizer, "The END. STOP here")
    if backend.streams == "vllm-text" and stop == ["D. S"]:
        # vLLM itself holds back the last len(stop) - 1 characters while a stop string may still match.
        streamed = ["The ", "E", "N"]
    assert paced_chunks(http, backend, prompt=prompt, max_tokens=ROOM, stop=stop) == \
        [(t, None) for t in streamed] + [("", "stop")]
    whole = complete(http, backend.model, prompt=prompt, max_tokens=ROOM, stop=stop)
    assert whole["choices"][0]["text"] == text and whole["choices"][0]["finish_reason"] == "stop"
    assert whole["usage"]["completion_tokens"] == (5 if stop == [" STOP"] else 4)


@pytest.mark.parametrize(("text", "pieces"), [
    ("Hello world! 😀 done", ["Hello", " world", "!", " 😀", " done"]),  # the emoji is two tokens
    ("北京是中国的首都。", list("北京是中国的首都。")),  # 9 characters, 15 tokens
])
def test_characters_split_across_tokens_arrive_whole(http: httpx.Client, tokenizer: Any, backend: EchoBackend,
                                                     text: str, pieces: list[str]) -> None:
    prompt = ids(tokenizer, text)
    if backend.streams == "text-pieces":
        # The ensemble decodes each response's tokens on their own: the bytes of a character split across
        # responses are lost there, before the service sees text (docs/backends.md says so).
        streamed = texts_and_reasons(chunks(http, backend.slow, prompt=prompt, max_tokens=len(prompt)))
        whole = complete(http, backend.model, prompt=prompt, max_tokens=len(prompt))["choices"][0]["text"]
        token_by_token = "".join(tokenizer.decode([token]) for token in prompt)  # one token per response
        assert "".join(text for text, _ in streamed) == whole == token_by_token and "\ufffd" in whole
        return
    if backend.streams == "cumulative-text" and pieces[3] == " 😀":
        pieces = [*pieces[:3], " ", "😀", *pieces[4:]]  # the space comes before the emoji's tokens are whole
    assert paced_chunks(http, backend, prompt=prompt, max_tokens=len(prompt)) == \
        [(p, None) for p in pieces] + [("", "length")]
    assert complete(http, backend.model, prompt=prompt, max_tokens=len(prompt))["choices"][0]["text"] == text


def test_length_and_stop_at_the_end_id(http: httpx.Client, tokenizer: Any, backend: EchoBackend) -> None:
    prompt = ids(tokenizer, "one two three")
    assert complete(http, backend.model, prompt=prompt, max_tokens=2)["choices"][0] == {
        "index": 0, "text": "one two", "logprobs": None, "finish_reason": "length"}
    with_end = [*ids(tokenizer, "one two"), END_ID, *ids(tokenizer, " three")]
    result = complete(http, backend.model, prompt=with_end, max_tokens=10)
    assert result["choices"][0]["text"] == "one two" and result["choices"][0]["finish_reason"] == "stop"
    generated = 3 if backend.counts_end_token else 2  # "one", " two" and the end token, where it is counted
    assert result["usage"] == {"prompt_tokens": 4, "completion_tokens": generated, "total_tokens": 4 + generated}


def test_without_max_tokens_a_completion_has_16_tokens(http: httpx.Client, backend: EchoBackend) -> None:
    """As OpenAI's completions API (and vLLM's): 16 tokens when `max_tokens` is not given."""
    words = " ".join(["one"] * 40)
    result = complete(http, backend.model, prompt=words)
    assert result["usage"]["completion_tokens"] == 16 and result["choices"][0]["finish_reason"] == "length"
    assert complete(http, backend.model, prompt=words, max_tokens=20)["usage"]["completion_tokens"] == 20


def test_n_and_several_prompts(http: httpx.Client, tokenizer: Any, backend: EchoBackend) -> None:
    prompts = [ids(tokenizer, "alpha"), ids(tokenizer, "beta gamma")]
    result = complete(http, backend.model, prompt=prompts, n=2, max_tokens=2)
    assert [(c["index"], c["text"]) for c in result["choices"]] == [
        (0, "alphaalpha"), (1, "alphaalpha"), (2, "beta gamma"), (3, "beta gamma")]
    assert result["usage"] == {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
    streamed: dict[int, str] = {}
    for chunk in chunks(http, backend.model, prompt=prompts, n=2, max_tokens=2):
        choice = chunk["choices"][0]
        streamed[choice["index"]] = streamed.get(choice["index"], "") + choice["text"]
    assert streamed == {0: "alphaalpha", 1: "alphaalpha", 2: "beta gamma", 3: "beta gamma"}


def test_usage_chunk_then_done(http: httpx.Client, backend: EchoBackend) -> None:
    result = chunks(http, backend.model, prompt="one two", max_tokens=3, stream_options={"include_usage": True})
    assert all(c["usage"] is None for c in result[:-1]) and all(c["choices"] for c in result[:-1])
    assert result[-1]["choices"] == [] and result[-1]["usage"] == {
        "prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    assert all("usage" not in c for c in chunks(http, backend.model, prompt="one two", max_tokens=3))


def test_echo(http: httpx.Client, backend: EchoBackend) -> None:
    only = complete(http, backend.model, prompt="Say it twice", max_tokens=0, echo=True)
    assert only["choices"][0]["text"] == "Say it twice" and only["usage"]["completion_tokens"] == 0
    assert [text for text, _ in paced_chunks(http, backend, prompt="Say it", max_tokens=2, echo=True)] == \
        ["Say it", "Say", " it", ""]


def test_logprobs_of_the_chosen_tokens(http: httpx.Client, tokenizer: Any, backend: EchoBackend) -> None:
    prompt = ids(tokenizer, "one two 😀")
    if not backend.logprobs:  # the backend returns none: refused, naming the parameter and the backend
        response = http.post("/v1/completions", json={"model": backend.model, "prompt": prompt, "logprobs": 0})
        assert response.status_code == 400 and response.json()["error"]["param"] == "logprobs"
        assert backend.adapter in response.json()["error"]["message"]
        return
    choice = complete(http, backend.model, prompt=prompt, max_tokens=4, logprobs=0)["choices"][0]
    logprobs = choice["logprobs"]
    assert choice["text"] == "one two 😀" and logprobs["tokens"][:2] == ["one", " two"]
    assert [round(v, 3) for v in logprobs["token_logprobs"]] == [-0.1, -0.2, -0.3, -0.4]  # the echo's values
    assert logprobs["text_offset"] == [0, 3, 7, 7]
    streamed = chunks(http, backend.slow, prompt=prompt, max_tokens=4, logprobs=0)
    assert [len(c["choices"][0]["logprobs"]["tokens"]) for c in streamed[:-1]] == [1, 1, 2]  # the emoji's two


def test_the_seeds_example_with_stream_as_a_string(http: httpx.Client, backend: EchoBackend) -> None:
    events = stream_events(http, "/v1/completions", {
        "model": backend.model, "stream": "true", "prompt": "Once upon a time", "max_tokens": 41,
        "temperature": 0.5})
    body = [json.loads(e.data) for e in events[:-1]]
    assert events[-1].data == "[DONE]" and body[-1]["choices"][0]["finish_reason"] == "length"
    assert "".join(c["choices"][0]["text"] for c in body).startswith("Once upon a timeOnce upon")


def test_openai_sdk(client: openai.OpenAI, backend: EchoBackend) -> None:
    # "world" is held back as a possible start of "world " until the next token says otherwise.
    result = client.completions.create(model=backend.model, prompt="Hello world", max_tokens=3, stop=["world "])
    assert result.choices[0].text == "Hello worldHello" and result.choices[0].finish_reason == "length"
    streamed = list(client.completions.create(model=backend.model, prompt="Hello world", max_tokens=3, stream=True,
                                              stop="world ", stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "Hello worldHello"
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 3


def test_a_stream_interval_joins_the_tokens_in_between_and_the_first_leaves_alone(
        client: openai.OpenAI) -> None:
    # ft-echo-interval: a token every 20 ms, a message at most every second (`stream_interval_ms`).
    prompt = "one two three four five six seven eight nine ten eleven twelve"
    whole = client.completions.create(model="ft-echo-interval", prompt=prompt, max_tokens=12).choices[0].text
    texts = [c.choices[0].text for c in client.completions.create(model="ft-echo-interval", prompt=prompt,
                                                                  max_tokens=12, stream=True)]
    assert "".join(texts) == whole == prompt
    assert texts[0] == "one"  # alone: the first message leaves at once
    assert 2 <= len(texts) <= 3  # 11 tokens over some 220 ms, and the end lets them go: not 11 messages


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_disconnect_cancels_generation_in_triton(http: httpx.Client, events_file: Path,
                                                          backend: EchoBackend, stream: bool) -> None:
    offset = events_offset(events_file)
    body = {"model": backend.slow, "prompt": "tick tock", "max_tokens": 200, "stream": stream}
    if stream:
        with http.stream("POST", "/v1/completions", json=body) as response:
            received = 0
            for line in response.iter_lines():
                received += line.startswith("data:")
                if received == 2:
                    break  # leaving the block closes the connection
    else:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the connection
            http.post("/v1/completions", json=body, timeout=0.5)

    def cancelled() -> list[dict[str, Any]]:
        return [e for e in read_events(events_file, offset)
                if e["event"] == "cancelled" and e["model"] == backend.model]

    # The request is cancelled inside Triton within 1 s of the disconnect (the model checks every 50 ms).
    wait_until(lambda: bool(cancelled()), 1, "the model to see the cancellation")
    assert cancelled()[0]["tokens"] < 200
    assert complete(http, backend.model, prompt="still", max_tokens=1)["choices"][0]["text"] == "still"


def test_an_error_after_the_headers_is_an_sse_error_then_done(http: httpx.Client, client: openai.OpenAI,
                                                              backend: EchoBackend) -> None:
    body = {"model": backend.failing, "prompt": "one two three four", "max_tokens": 10}
    events = stream_events(http, "/v1/completions", {**body, "stream": True})
    *chunks, failure, done = events  # tokens that arrive together may share a chunk
    assert [e.name for e in events] == [None] * len(chunks) + ["error", None]
    assert "".join(json.loads(e.data)["choices"][0]["text"] for e in chunks) == "one two three"
    error = json.loads(failure.data)
    validate(error, "ErrorResponse")
    assert error["error"]["type"] == "server_error" and "Traceback" not in failure.data
    assert done.data == "[DONE]"
    with pytest.raises(openai.APIError):
        list(client.completions.create(**body, stream=True))
    whole = http.post("/v1/completions", json=body)
    assert whole.status_code == 500
    validate(whole.json(), "ErrorResponse")


def test_an_edge_stopped_with_sigterm_finishes_its_streams_first(stack: LocalStack, http: httpx.Client,
                                                                 tmp_path: Path) -> None:
    port = free_port()
    edge = _spawn(["edge", "--port", str(port), f"--llm={stack.service_address('llm')}",
                   f"--embed=127.0.0.1:{free_port()}", f"--rerank=127.0.0.1:{free_port()}"],
                  dict(os.environ), tmp_path / "edge.log")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{url}/health"), 60, "the edge", edge)
        body = {"model": SLOW, "prompt": "tick tock", "max_tokens": 30, "stream": True}  # 1.5 s of tokens
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
            lines = response.iter_lines()
            data = [line for line in (next(lines), next(lines), next(lines)) if line.startswith("data:")]
            edge.send_signal(signal.SIGTERM)
            data += [line for line in lines if line.startswith("data:")]
        assert data[-1] == "data: [DONE]" and json.loads(data[-2][5:])["choices"][0]["finish_reason"] == "length"
        whole = complete(http, ECHO, prompt="tick tock", max_tokens=30)["choices"][0]["text"]
        assert "".join(json.loads(line[5:])["choices"][0]["text"] for line in data[:-1]) == whole
        assert edge.wait(30) == 0
    finally:
        if edge.poll() is None:
            edge.kill()
            edge.wait()


def _bad_requests() -> list[tuple[str, dict[str, Any], int, str | None]]:
    return [
        ("token outside the vocabulary", {"prompt": [1, 49152]}, 400, "prompt"),
        ("negative token", {"prompt": [-1]}, 400, "prompt"),
        ("prompt longer than the context", {"prompt": "word " * 300}, 400, "prompt"),
        ("max_tokens beyond the context", {"prompt": "x", "max_tokens": 256}, 400, "max_tokens"),
        ("max_tokens negative", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
        ("max_tokens 0 without echo", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("empty prompt", {"prompt": []}, 400, "prompt"),
        ("missing prompt", {}, 400, "prompt"),
        ("suffix", {"prompt": "x", "suffix": "y"}, 400, "suffix"),
        ("best_of unlike n", {"prompt": "x", "best_of": 3}, 400, "best_of"),
        ("n 0", {"prompt": "x", "n": 0}, 400, "n"),
        ("n 17", {"prompt": "x", "n": 17}, 400, "n"),
        ("temperature 2.5", {"prompt": "x", "temperature": 2.5}, 400, "temperature"),
        ("temperature negative", {"prompt": "x", "temperature": -0.1}, 400, "temperature"),
        ("top_p 1.5", {"prompt": "x", "top_p": 1.5}, 400, "top_p"),
        ("top_p negative", {"prompt": "x", "top_p": -0.5}, 400, "top_p"),
        ("17 stop strings", {"prompt": "x", "stop": [chr(97 + i) for i in range(17)]}, 400, "stop"),
        ("logprobs 6", {"prompt": "x", "logprobs": 6}, 400, "logprobs"),
        ("stream_options without stream", {"prompt": "x", "stream_options": {"include_usage": True}}, 400,
         "stream_options"),
        ("unknown model", {"model": "no-such-model", "prompt": "x"}, 404, "model"),
        ("embedding model", {"model": "all-minilm-l6-v2", "prompt": "x"}, 400, "model"),
    ]


@pytest.mark.parametrize(("case", "body", "status", "param"), _bad_requests(), ids=[c[0] for c in _bad_requests()])
def test_bad_requests_get_openai_errors(http: httpx.Client, backend: EchoBackend, case: str, body: dict[str, Any],
                                        status: int, param: str | None) -> None:
    for stream in (False, True) if "stream_options" not in body else (False,):
        response = http.post("/v1/completions", json={"model": backend.model, **body, "stream": stream})
        assert response.status_code == status, response.text
        error = response.json()
        validate(error, "ErrorResponse")
        assert error["error"]["param"] == param and "Traceback" not in response.text
    assert complete(http, backend.model, prompt="fine", max_tokens=1)["choices"][0]["text"] == "fine"


def test_a_knob_the_backend_lacks_is_refused_naming_it_and_the_backend(http: httpx.Client,
                                                                        backend: EchoBackend) -> None:
    for param, value in backend.lacks.items():
        extra = {"logprobs": 2} if param == "top_logprobs" else {param: value}  # alternatives: logprobs > 0
        response = http.post("/v1/completions", json={"model": backend.model, "prompt": "x", **extra})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param and backend.adapter in error["message"], error
    assert complete(http, backend.model, prompt="fine", max_tokens=1)["choices"][0]["text"] == "fine"


def test_stop_strings_that_are_prefixes_of_each_other(http: httpx.Client, backend: EchoBackend) -> None:
    """The earliest match in the text wins, whichever stop string it is, in any order, streamed or not."""
    for stop, expected in ((["two", "two three"], "one "), (["two three", "two"], "one "), (["e t", "e"], "on"),
                           (["wo", "wo t"], "one t")):
        whole = complete(http, backend.model, prompt="one two three", max_tokens=ROOM, stop=stop)["choices"][0]
        assert (whole["text"], whole["finish_reason"]) == (expected, "stop"), stop
        streamed = chunks(http, backend.model, prompt="one two three", max_tokens=ROOM, stop=stop)
        assert "".join(c["choices"][0]["text"] for c in streamed) == expected
        assert streamed[-1]["choices"][0]["finish_reason"] == "stop"
