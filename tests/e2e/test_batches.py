"""The Batch API through the `openai` SDK's `files` and `batches` calls, on an edge of its own beside the
session's stack (its services and Triton), with a state store and a files folder of its own: batches of
every kind answer each custom_id once while interactive requests are served; bad lines become error lines;
cancel and an expired window keep the finished lines; an edge killed mid-batch is replaced by another that
finishes it; the bad requests' 4xx; and a batch whose files are in a real S3-compatible server (moto's)."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from launcher.stack import LocalStack, http_ok
from tests.support.edges import create_key, usage
from tests.support.ports import free_port, wait_until
from tests.support.s3_server import CREDENTIALS, s3_server
from tests.support.stack import private_state_url, spawn
from tritongate.registry import SERVICES

CHAT, EMBED, RERANK = "ft-echo-slow", "all-minilm-l6-v2", "minilm-rerank"  # ft-echo-slow: 50 ms a token
FILE_LIMIT = 256 * 1024
ENDED = ("completed", "failed", "expired", "cancelled")


@dataclass
class Edge:
    """An edge process of its own; `restart` kills it and starts another on the same store and files."""

    stack: LocalStack
    env: dict[str, str]
    log_dir: Path
    process: subprocess.Popen[bytes] | None = None
    url: str = ""

    def start(self) -> None:
        port = free_port()
        targets = [f"--{service.name}={self.stack.service_address(service)}" for service in SERVICES]
        log = self.log_dir / f"edge-{port}.log"
        self.process = spawn(["edge", "--port", str(port), *targets], self.env, log)
        self.url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_ok(f"{self.url}/health"), 60, "the batch edge", self.process)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(30)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def edge(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    edge = start_edge(stack, tmp_path_factory.mktemp("batches"))
    yield edge
    edge.stop()


def start_edge(stack: LocalStack, directory: Path, **settings: str) -> Edge:
    env = dict(os.environ, TRITONGATE_STATE_URL=private_state_url(),
               TRITONGATE_BATCH_FILES_DIR=str(directory / "files"),
               TRITONGATE_BATCH_FILE_MAX_BYTES=str(FILE_LIMIT), TRITONGATE_BATCH_LEASE_S="2",
               TRITONGATE_BATCH_CONCURRENCY="4", **settings)
    edge = Edge(stack, env, directory)
    edge.start()
    return edge


@pytest.fixture
def client(edge: Edge) -> openai.OpenAI:
    return edge.client()


def jsonl(lines: list[dict[str, Any]] | list[bytes]) -> bytes:
    return b"\n".join(line if isinstance(line, bytes) else orjson.dumps(line) for line in lines) + b"\n"


def chat_line(custom_id: str, tokens: int = 3, model: str = CHAT) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"say {custom_id}"}],
                     "max_tokens": tokens}}


def embed_line(custom_id: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"model": EMBED, "input": f"text number {custom_id}"}}


def submit(client: openai.OpenAI, lines: list[dict[str, Any]] | list[bytes], endpoint: str = "/v1/chat/completions",
           window: str = "24h") -> Any:
    file = client.files.create(file=("batch.jsonl", jsonl(lines)), purpose="batch")
    assert (file.purpose, file.bytes, file.object) == ("batch", len(jsonl(lines)), "file")
    batch = client.batches.create(input_file_id=file.id, endpoint=endpoint,  # type: ignore[arg-type]
                                  completion_window=window)  # type: ignore[arg-type]
    assert batch.status in ("validating", "in_progress") and batch.input_file_id == file.id
    return batch


def wait_for(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...] = ENDED, timeout: float = 240,
             ) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        time.sleep(0.2)
    raise TimeoutError(f"batch {batch_id} still {batch.status} ({batch.request_counts})")


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [orjson.loads(line) for line in client.files.content(file_id).content.splitlines()]


def answers(client: openai.OpenAI, batch: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The output and error lines; every custom_id in them once."""
    output, errors = lines_of(client, batch.output_file_id), lines_of(client, batch.error_file_id)
    ids = [line["custom_id"] for line in output + errors if line["custom_id"] is not None]
    assert len(ids) == len(set(ids)), "a custom_id answered twice"
    assert (len(output), len(errors)) == (batch.request_counts.completed, batch.request_counts.failed)
    return output, errors


def test_a_chat_and_an_embeddings_batch_answer_every_line_once_while_interactive_requests_are_served(
        client: openai.OpenAI) -> None:
    chats = submit(client, [chat_line(f"chat-{i}") for i in range(100)])
    embeds = submit(client, [embed_line(f"embed-{i}") for i in range(100)], "/v1/embeddings")
    progress = []  # request_counts seen while the chat batch ran
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        def interactive() -> int:
            served = 0
            while client.batches.retrieve(chats.id).status not in ENDED:
                answer = client.chat.completions.create(model="ft-echo", max_tokens=2,
                                                        messages=[{"role": "user", "content": "hello"}])
                served += answer.choices[0].message.content is not None
            return served

        served = pool.submit(interactive)
        while (batch := client.batches.retrieve(chats.id)).status not in ENDED:
            progress.append((batch.status, batch.request_counts.completed if batch.request_counts else 0))
            time.sleep(0.1)
        assert served.result() > 0
    assert any(status == "in_progress" and 0 < done < 100 for status, done in progress), progress
    for batch, expected in ((wait_for(client, chats.id), "chat"), (wait_for(client, embeds.id), "embed")):
        assert batch.status == "completed" and batch.completed_at and batch.error_file_id is None
        assert batch.request_counts.model_dump() == {"total": 100, "completed": 100, "failed": 0}
        output, _ = answers(client, batch)
        assert sorted(line["custom_id"] for line in output) == sorted(f"{expected}-{i}" for i in range(100))
        for line in output:
            assert line["id"].startswith("batch_req_") and line["error"] is None
            assert line["response"]["status_code"] == 200 and line["response"]["request_id"]
            body = line["response"]["body"]
            if expected == "chat":
                assert body["object"] == "chat.completion" and body["choices"][0]["message"]["content"]
            else:
                assert len(body["data"][0]["embedding"]) == 384
    listed = client.batches.list(limit=1)
    assert [b.id for b in listed.data] == [embeds.id] and listed.has_more
    assert [b.id for b in client.batches.list(limit=1, after=embeds.id).data] == [chats.id]


def test_bad_lines_become_error_lines_and_the_rest_run(client: openai.OpenAI) -> None:
    rerank = {"custom_id": "wrong-url", "method": "POST", "url": "/v1/rerank", "body": {"model": RERANK}}
    lines: list[bytes] = [orjson.dumps(chat_line("good", model="ft-echo")), b"{this is not json",
                          orjson.dumps(rerank), orjson.dumps({**chat_line("elsewhere"), "url": "/v1/moderations"}),
                          orjson.dumps(chat_line("no-such-model", model="no-such-model")),
                          orjson.dumps(chat_line("too-long", model="ft-echo") | {"body": {"model": "ft-echo"}})]
    batch = wait_for(client, submit(client, lines).id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 6, "completed": 1, "failed": 5}
    output, errors = answers(client, batch)
    assert [line["custom_id"] for line in output] == ["good"]
    by_id = {line["custom_id"]: line for line in errors}
    assert by_id[None]["error"]["code"] == "invalid_json_line" and "Line 2" in by_id[None]["error"]["message"]
    assert by_id["wrong-url"]["error"]["code"] == by_id["elsewhere"]["error"]["code"] == "invalid_url"
    assert by_id["no-such-model"]["response"]["status_code"] == 404
    assert by_id["no-such-model"]["response"]["body"]["error"]["param"] == "model"
    assert by_id["too-long"]["response"]["status_code"] == 400
    assert by_id["too-long"]["response"]["body"]["error"]["param"] == "messages"


def test_a_rerank_batch(client: openai.OpenAI) -> None:
    lines = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/rerank",
              "body": {"model": RERANK, "query": "what is a cat?", "documents": ["a cat is an animal", "bread"]}}
             for i in range(3)]
    batch = wait_for(client, submit(client, lines, "/v1/rerank").id)
    output, _ = answers(client, batch)
    assert batch.status == "completed" and len(output) == 3
    assert output[0]["response"]["body"]["results"][0]["index"] == 0


def test_a_cancelled_batch_keeps_its_finished_lines(client: openai.OpenAI) -> None:
    batch = submit(client, [chat_line(f"c{i}", tokens=16) for i in range(60)])  # about 0.8 s a line
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed > 0, 120, "a first line")
    assert client.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    batch = wait_for(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelled_at and batch.cancelling_at
    output, errors = answers(client, batch)
    assert 0 < len(output) < 60 and len(output) + len(errors) == 60
    assert {line["error"]["code"] for line in errors} == {"batch_cancelled"}
    assert client.batches.cancel(batch.id).status == "cancelled"  # again: as it is


def test_a_batch_past_its_window_expires_with_its_finished_lines(client: openai.OpenAI) -> None:
    batch = wait_for(client, submit(client, [chat_line(f"x{i}", tokens=16) for i in range(60)], window="4s").id)
    assert batch.status == "expired" and batch.expired_at
    output, errors = answers(client, batch)
    assert 0 < len(output) < 60 and len(output) + len(errors) == 60
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


def test_an_edge_killed_mid_batch_is_replaced_by_one_that_finishes_it(edge: Edge) -> None:
    client = edge.client()
    batch = submit(client, [chat_line(f"k{i}", tokens=8) for i in range(40)])  # about 0.4 s a line
    wait_until(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 8, 120, "8 lines")
    edge.kill()
    edge.start()  # the lease (2 s) runs out, and the new edge takes the batch where it stopped
    client = edge.client()
    before = client.batches.retrieve(batch.id).request_counts.completed
    assert 8 <= before < 40
    batch = wait_for(client, batch.id)
    assert batch.status == "completed"
    assert batch.request_counts.model_dump() == {"total": 40, "completed": 40, "failed": 0}
    output, _ = answers(client, batch)
    assert sorted(line["custom_id"] for line in output) == sorted(f"k{i}" for i in range(40))


def status_of(call: Any) -> tuple[int, str | None]:
    with pytest.raises(openai.APIStatusError) as raised:
        call()
    body = raised.value.body
    return raised.value.status_code, body.get("param") if isinstance(body, dict) else None


def test_bad_requests_are_refused_with_their_status_and_param(client: openai.OpenAI) -> None:
    file = client.files.create(file=("ok.jsonl", jsonl([chat_line("a")])), purpose="batch")
    twice = client.files.create(file=("twice.jsonl", jsonl([chat_line("a"), chat_line("a")])), purpose="batch")
    empty = client.files.create(file=("empty.jsonl", b"\n\n"), purpose="batch")
    big = jsonl([chat_line("x" * 1000 + str(i)) for i in range(300)])
    assert len(big) > FILE_LIMIT
    assert status_of(lambda: client.files.create(file=("big.jsonl", big), purpose="batch"))[0] == 413
    assert status_of(lambda: client.files.create(file=("a.jsonl", b"{}"), purpose="fine-tune")) == (400, "purpose")
    for call in (lambda: client.files.retrieve("file-nope"), lambda: client.files.content("file-nope"),
                 lambda: client.files.delete("file-nope")):
        assert status_of(call) == (404, "file_id")
    for call in (lambda: client.batches.retrieve("batch_nope"), lambda: client.batches.cancel("batch_nope")):
        assert status_of(call) == (404, "batch_id")

    def create(file_id: str = file.id, endpoint: str = "/v1/chat/completions", window: str = "24h") -> Any:
        return lambda: client.batches.create(input_file_id=file_id, endpoint=endpoint,  # type: ignore[arg-type]
                                             completion_window=window)  # type: ignore[arg-type]

    assert status_of(create("file-nope")) == (404, "input_file_id")
    assert status_of(create(endpoint="/v1/moderations")) == (400, "endpoint")
    assert status_of(create(window="2d")) == (400, "completion_window")
    assert status_of(create(twice.id)) == (400, "input_file_id")
    assert status_of(create(empty.id)) == (400, "input_file_id")
    assert status_of(lambda: client.batches.list(limit=500)) == (400, "limit")
    assert status_of(lambda: client.batches.list(after="batch_nope")) == (400, "after")
    done = wait_for(client, client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions",
                                                  completion_window="24h").id)
    assert status_of(lambda: client.batches.cancel(done.id)) == (409, "batch_id")
    assert file.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.delete(file.id).deleted
    assert status_of(lambda: client.files.retrieve(file.id)) == (404, "file_id")


def test_a_batch_runs_with_its_creators_key(stack: LocalStack, tmp_path: Path) -> None:
    """A batch's lines are the key's own requests: a model the key may not use answers 404 in its lines, the
    others count in the key's usage, and another key does not see the batch."""
    edge = start_edge(stack, tmp_path)
    state_url = edge.env["TRITONGATE_STATE_URL"]
    try:
        embed_only = create_key(state_url, "embed-only", "--models", EMBED)
        client = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=embed_only, max_retries=0, timeout=60)
        chat = wait_for(client, submit(client, [chat_line(f"c{i}") for i in range(3)]).id)
        output, errors = answers(client, chat)
        assert not output and sorted(line["custom_id"] for line in errors) == ["c0", "c1", "c2"]
        assert {line["response"]["status_code"] for line in errors} == {404}
        assert {line["response"]["body"]["error"]["code"] for line in errors} == {"model_not_found"}

        embeds = wait_for(client, submit(client, [embed_line(f"e{i}") for i in range(3)], "/v1/embeddings").id)
        output, errors = answers(client, embeds)
        assert sorted(line["custom_id"] for line in output) == ["e0", "e1", "e2"] and not errors
        counted = usage(state_url, "embed-only")[EMBED]
        assert counted["requests"] == 3
        assert counted["prompt_tokens"] == sum(line["response"]["body"]["usage"]["prompt_tokens"] for line in output)

        stranger = openai.OpenAI(base_url=f"{edge.url}/v1", api_key=create_key(state_url, "other"), max_retries=0,
                                 timeout=60)
        assert status_of(lambda: stranger.batches.retrieve(embeds.id)) == (404, "batch_id")
    finally:
        edge.stop()


def test_files_in_an_s3_compatible_store(stack: LocalStack, tmp_path: Path) -> None:
    import boto3

    with s3_server() as s3:
        edge = start_edge(stack, tmp_path, TRITONGATE_BATCH_FILES_URL=f"s3://{s3.bucket}/tritongate",
                          TRITONGATE_BATCH_S3_ENDPOINT_URL=s3.endpoint_url, **CREDENTIALS)
        try:
            client = edge.client()
            batch = wait_for(client, submit(client, [chat_line(f"s{i}", model="ft-echo") for i in range(5)]).id)
            output, _ = answers(client, batch)
            assert batch.status == "completed" and sorted(line["custom_id"] for line in output) == [
                f"s{i}" for i in range(5)]
            bucket = boto3.client("s3", endpoint_url=s3.endpoint_url, aws_access_key_id="test",
                                  aws_secret_access_key="test", region_name="us-east-1")
            keys = {item["Key"] for item in bucket.list_objects_v2(Bucket=s3.bucket)["Contents"]}
            assert {f"tritongate/{batch.input_file_id}", f"tritongate/{batch.output_file_id}"} <= keys
            assert not list((tmp_path / "files").glob("*"))
        finally:
            edge.stop()
