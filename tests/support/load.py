"""Requests in loops from threads, every answer recorded: the load under which tests kill and restart
parts of the stack, then read what failed, and when. Bounded in time and in count: it stops by itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

# A loop's request: its path, and its body (or what makes the body of a thread's n-th request).
Body = dict[str, Any] | Callable[[int, int], dict[str, Any]]
RETRY_AFTER_S = 0.5  # before a request that got no answer is sent again (with `retry_transport`)


@dataclass(frozen=True)
class Outcome:
    name: str  # the loop's
    started: float  # time.monotonic()
    ended: float
    status: int  # 0: no HTTP answer at all
    code: str | None = None  # the OpenAI error's
    retry_after: str | None = None
    text: str = ""  # a failed answer's body, or the transport error

    @property
    def seconds(self) -> float:
        return self.ended - self.started


class Load:
    """`threads` threads per loop (`loops`: name → (path, body)), each sending one request after another
    on its own connection, `pause_s` apart. With `retry_transport`, a request that gets no HTTP answer is
    sent once more, RETRY_AFTER_S later, on a new connection (httpx opens one): the process that held the
    connection was killed, and a connection opened at once may still land in its closing socket's queue."""

    def __init__(self, url: str, loops: dict[str, tuple[str, Body]], threads: int = 1, pause_s: float = 0.02,
                 retry_transport: bool = False, limit_s: float = 600.0, max_requests: int = 50_000) -> None:
        self.url, self.loops, self.pause_s, self.retry_transport = url, loops, pause_s, retry_transport
        self.limit_s, self.max_requests = limit_s, max_requests
        self._outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, args=(name, worker), daemon=True)
                         for name in loops for worker in range(threads)]

    def __enter__(self) -> Load:
        self._deadline = time.monotonic() + self.limit_s
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline and len(self._outcomes) < self.max_requests

    def _loop(self, name: str, worker: int) -> None:
        path, body = self.loops[name]
        with httpx.Client(base_url=self.url, timeout=60) as http:
            sent = 0
            while self._running():
                started = time.monotonic()
                outcome = self._send(http, name, path, body(worker, sent) if callable(body) else body, started)
                with self._lock:
                    self._outcomes.append(outcome)
                sent += 1
                time.sleep(self.pause_s)

    def _send(self, http: httpx.Client, name: str, path: str, body: dict[str, Any], started: float) -> Outcome:
        for attempt in (1, 2):
            try:
                response = http.post(path, json=body)
            except httpx.HTTPError as exc:
                if self.retry_transport and attempt == 1:
                    time.sleep(RETRY_AFTER_S)
                    continue
                return Outcome(name, started, time.monotonic(), 0, text=f"{type(exc).__name__}: {exc}")
            failed = not response.is_success
            code = response.json().get("error", {}).get("code") if failed and _is_json(response) else None
            return Outcome(name, started, time.monotonic(), response.status_code, code,
                           response.headers.get("retry-after"), response.text if failed else "")
        raise AssertionError("unreachable")

    @property
    def outcomes(self) -> list[Outcome]:
        with self._lock:
            return list(self._outcomes)

    def since(self, start: float) -> list[Outcome]:
        """The answers that came at `start` or later."""
        return [o for o in self.outcomes if o.ended >= start]

    def failed(self, start: float = 0.0) -> list[Outcome]:
        return [o for o in self.since(start) if o.status != 200]

    def ok_since(self, start: float) -> set[str]:
        """The loops that had a request answered with 200 after `start`."""
        return {o.name for o in self.since(start) if o.status == 200}

    def first_ok(self, name: str, since: float) -> float | None:
        """When the first request of loop `name` sent after `since` was answered with 200."""
        return next((o.ended for o in self.outcomes if o.name == name and o.started > since and o.status == 200),
                    None)


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")
