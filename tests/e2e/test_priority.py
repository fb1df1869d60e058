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

MODEL = "ft-echo-slow"  # 50 ms a token: a long answer holds the slot for seconds


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


def served_order(edge: Edge, requests: list[tuple[str, str, dict[str, Any]]]) -> list[str]:
    """Hold the slot with a stream, queue `requests` (label, key name, extra fields) in this order, let the
    stream go: the labels in the order they were answered."""
    order: list[str] = []
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {edge.keys['holder']}"}
    with httpx.Client(timeout=120) as http, http.stream(
            "POST", f"{edge.url}/v1/chat/completions", headers=headers,
            json=body(max_tokens=400, stream=True, messages=[{"role": "user", "content": "a b c d " * 100}])) as held:
        assert held.status_code == 200
        next(held.iter_lines())  # generating: the slot is taken

        def one(label: str, key: str, fields: dict[str, Any]) -> None:
            extra = fields.pop("headers", {})
            response = httpx.post(f"{edge.url}/v1/chat/completions", json=body(**fields), timeout=120,
                                  headers={"Authorization": f"Bearer {edge.keys[key]}", **extra})
            assert response.status_code == 200, response.text
            with lock:
                order.append(label)

        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            futures = []
            for i, request in enumerate(requests):
                futures.append(pool.submit(one, *request))
                wait_until(lambda i=i: depth(edge) == i + 1, 30, f"request {i} in the queue")
            held.close()  # the stream's end gives the slot to the queue
            for future in futures:
                future.result()
    return order


def test_with_the_queue_full_of_a_low_priority_key_a_high_priority_request_is_served_next(edge: Edge) -> None:
    requests = [(f"bulk-{i}", "bulk", {}) for i in range(4)]  # the key's default priority: 10
    requests += [("user", "user", {"priority": -5})]
    order = served_order(edge, requests)
    assert order[0] == "user", order
    assert sorted(order[1:]) == [f"bulk-{i}" for i in range(4)]


def test_the_priority_header_and_the_field_order_the_queue_as_the_key_default_does(edge: Edge) -> None:
    order = served_order(edge, [("bulk", "bulk", {}), ("a", "a", {}),
                                ("b-header", "b", {"headers": {"x-tritongate-priority": "-2"}}),
                                ("a-field", "a", {"priority": -3})])
    assert order == ["a-field", "b-header", "a", "bulk"]


def test_two_keys_of_one_class_share_the_service_evenly(edge: Edge) -> None:
    requests = [(f"a-{i}", "a", {}) for i in range(6)] + [(f"b-{i}", "b", {}) for i in range(6)]
    order = served_order(edge, requests)
    first_half = order[:6]
    assert abs(sum(label.startswith("a") for label in first_half) - 3) <= 1, order
