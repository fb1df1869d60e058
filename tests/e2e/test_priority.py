"""Priority and fair queuing end to end: an edge that lets one request of a model reach its service at a
time (TRITONGATE_QUEUE_SLOTS=1), three keys in its store. A streamed request holds the slot while others
queue (watched through the queue-depth metric, not the clock); once it ends, the order in which the
queued requests are answered is the order the queue served them in."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from launcher.stack import LocalStack
from tests.support.edges import create_key, edges
from tests.support.metrics import total
from tests.support.ports import wait_until
from tests.support.stack import private_state_url

MODEL = "ft-echo-slow"  # 50 ms a token: a long answer holds the slot for seconds (256 tokens at most)


@dataclass
class Edge:
    url: str
    keys: dict[str, str]  # name → key


@pytest.fixture(scope="module")
def edge(stack: LocalStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    state_url = private_state_url()
    keys = {"holder": create_key(state_url, "holder"), "bulk": create_key(state_url, "bulk", "--priority", "10"),
            "a": create_key(state_url, "a"), "b": create_key(state_url, "b"), "user": create_key(state_url, "user")}
    env = {"TRITONGATE_STATE_URL": state_url, "TRITONGATE_QUEUE_SLOTS": "1", "TRITONGATE_QUEUE_TIMEOUT_S": "120"}
    with edges(stack, env, tmp_path_factory.mktemp("priority")) as (url,):
        yield Edge(url, keys)


def depth(edge: Edge) -> float:
    return total(httpx.get(f"{edge.url}/metrics", timeout=10).text, "tritongate_queue_depth", model=MODEL)


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1, **fields}


def served_order(edge: Edge, groups: list[list[tuple[str, str, dict[str, Any]]]]) -> list[str]:
    """Hold the slot with a stream, queue each group of requests (label, key name, extra fields) at once,
    group after group, then let the stream go: the labels in the order they were answered."""
    order: list[str] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {edge.keys['holder']}"}
    # The echo model repeats a completion's prompt: 230 tokens at 50 ms, unless the stream is closed first.
    holder = {"model": MODEL, "prompt": "a b c d " * 4, "max_tokens": 230, "stream": True}
    with httpx.Client(timeout=120) as http, http.stream("POST", f"{edge.url}/v1/completions", headers=headers,
                                                        json=holder) as held:
        assert held.status_code == 200, held.read()
        lines = held.iter_lines()  # kept: a dropped iterator closes the connection
        first = next(line for line in lines if line.startswith("data:"))
        assert "error" not in first, first  # generating: the slot is taken

        def one(label: str, key: str, fields: dict[str, Any]) -> None:
            extra = fields.pop("headers", {})
            response = httpx.post(f"{edge.url}/v1/chat/completions", json=body(**fields), timeout=120,
                                  headers={"Authorization": f"Bearer {edge.keys[key]}", **extra})
            assert response.status_code == 200, response.text
            with lock:
                order.append(label)

        count = sum(len(group) for group in groups)
        with concurrent.futures.ThreadPoolExecutor(count) as pool:
            futures = []
            for group in groups:
                futures += [pool.submit(one, *request) for request in group]
                queued = len(futures)
                wait_until(lambda queued=queued: depth(edge) == queued, 30, f"{queued} requests queued")
            held.close()  # the stream's end gives the slot to the queue
            for future in futures:
                future.result()
    return order


def test_with_the_queue_full_of_a_low_priority_key_a_high_priority_request_is_served_next(edge: Edge) -> None:
    bulk = [(f"bulk-{i}", "bulk", {}) for i in range(4)]  # the key's default priority: 10
    order = served_order(edge, [bulk, [("user", "user", {"priority": -5})]])
    assert order[0] == "user", order
    assert sorted(order[1:]) == [f"bulk-{i}" for i in range(4)]


def test_the_priority_header_and_the_field_order_the_queue_as_the_key_default_does(edge: Edge) -> None:
    order = served_order(edge, [[("bulk", "bulk", {}), ("a", "a", {}),
                                 ("b-header", "b", {"headers": {"x-tritongate-priority": "-2"}}),
                                 ("a-field", "a", {"priority": -3})]])
    assert order == ["a-field", "b-header", "a", "bulk"]


def test_two_keys_of_one_class_share_the_service_evenly(edge: Edge) -> None:
    order = served_order(edge, [[(f"a-{i}", "a", {}) for i in range(5)], [(f"b-{i}", "b", {}) for i in range(5)]])
    first_half = order[:5]
    assert abs(sum(label.startswith("a") for label in first_half) - 2.5) <= 1, order
