"""Where a request's time went, end to end on the session stack: the `Server-Timing` header of embeddings,
rerank and chat (whole and streamed), the stages in the access log and in the edge's metrics. Only
consistency is checked (each stage non-negative and within the total), never how long anything took."""

from __future__ import annotations

import re
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from launcher.stack import LocalStack
from tests.support.ports import wait_until

EMBEDDING = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
CHAT = {"model": "ft-echo", "messages": [{"role": "user", "content": "one two three"}], "max_tokens": 5}
ENCODER_STAGES = ["hold", "tokenization", "queue", "inference"]  # in the order a request goes through them


def timings(response: httpx.Response) -> dict[str, float]:
    """The Server-Timing header as {name: milliseconds}; each entry `name;dur=<non-negative number>`."""
    parsed = {}
    for entry in response.headers["server-timing"].split(","):
        match = re.fullmatch(r"\s*([a-z]+);dur=(\d+(?:\.\d+)?)\s*", entry)
        assert match, entry
        parsed[match[1]] = float(match[2])
    return parsed


def access_line(stack: LocalStack, request_id: str) -> str:
    assert stack.log_dir is not None
    log = stack.log_dir / "edge.log"

    def lines() -> list[str]:
        text = log.read_text(errors="replace")
        return [line for line in text.splitlines() if f"[{request_id}]" in line and "tritongate.access" in line]

    wait_until(lines, 10, "the access-log line")
    (line,) = lines()
    return line


def logged(line: str) -> dict[str, float]:
    return {name: float(ms) for name, ms in re.findall(r" ([a-z]+)=(\d+(?:\.\d+)?)ms", line)}


def stage_counts(stack: LocalStack, model: str) -> dict[str, float]:
    text = httpx.get(f"{stack.edge_url}/metrics", timeout=5).text
    return {sample.labels["stage"]: sample.value for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "tritongate_request_stage_seconds_count" and sample.labels["model"] == model}


def within_total(stages: dict[str, float]) -> None:
    """The stages happen one after another inside the request: together they fit in its total."""
    total = stages["total"]
    assert all(ms <= total for ms in stages.values())
    assert sum(ms for name, ms in stages.items() if name in ENCODER_STAGES) <= total


@pytest.mark.parametrize(("path", "model", "body"), [
    ("/v1/embeddings", EMBEDDING, {"input": ["one", "two", "three"]}),
    ("/v1/rerank", RERANK, {"query": "q", "documents": ["a", "b"]}),
])
def test_embeddings_and_rerank_show_every_stage(http: httpx.Client, stack: LocalStack, path: str, model: str,
                                                body: dict[str, object]) -> None:
    before = stage_counts(stack, model)
    rid = f"test-{uuid.uuid4()}"
    response = http.post(path, json={"model": model, **body}, headers={"X-Request-ID": rid})
    assert response.status_code == 200
    shown = timings(response)
    assert list(shown) == [*ENCODER_STAGES, "total"]
    within_total(shown)
    # The log line has the same stages (its total is the line's duration, to the last byte).
    assert {name: ms for name, ms in logged(access_line(stack, rid)).items() if name in ENCODER_STAGES} == \
        {name: shown[name] for name in ENCODER_STAGES}
    after = stage_counts(stack, model)
    assert {stage: after[stage] - before.get(stage, 0) for stage in ENCODER_STAGES} == dict.fromkeys(ENCODER_STAGES, 1)


def test_concurrent_embeddings_each_carry_their_own_stages(stack: LocalStack) -> None:
    """Requests that arrive together may travel in one batch call; each answer still has its stages."""
    def embed(i: int) -> httpx.Response:
        return httpx.post(f"{stack.edge_url}/v1/embeddings", json={"model": EMBEDDING, "input": [f"text {i}"]},
                          timeout=120)

    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(embed, range(16)))
    for response in responses:
        assert response.status_code == 200
        shown = timings(response)
        assert list(shown) == [*ENCODER_STAGES, "total"]
        within_total(shown)


def test_a_whole_chat_shows_tokenization_inference_first_token_and_total(http: httpx.Client) -> None:
    response = http.post("/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    shown = timings(response)
    assert list(shown) == ["tokenization", "inference", "ttft", "total"]  # no coalescer or batcher for an LLM
    within_total(shown)
    assert shown["tokenization"] + shown["inference"] <= shown["total"]


def test_a_chat_stream_shows_what_came_before_its_first_token_and_logs_the_rest(http: httpx.Client,
                                                                               stack: LocalStack) -> None:
    rid = f"test-{uuid.uuid4()}"
    with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True},
                     headers={"X-Request-ID": rid}) as response:
        assert response.status_code == 200
        shown = timings(response)
        response.read()
    assert list(shown) == ["tokenization"]  # the headers leave before any token
    line = access_line(stack, rid)
    duration = re.search(r" (\d+(?:\.\d+)?)ms prompt_tokens=", line)
    assert duration, line
    total = float(duration[1])
    stages = logged(line)
    assert list(stages) == ["tokenization", "inference", "ttft"]
    assert stages["tokenization"] == shown["tokenization"]
    assert all(ms <= total for ms in stages.values())
