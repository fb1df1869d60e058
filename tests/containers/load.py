"""Steady embedding load on an edge's published loopback port, from a few threads, recording every answer:
the tests read what failed, and when. Bounded in time and in count; it stops by itself."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import TracebackType

import httpx


@dataclass(frozen=True)
class Outcome:
    at: float  # time.monotonic() when the answer came
    status: int | None  # None: no HTTP answer at all
    retry_after: str | None = None
    error: str | None = None


@dataclass
class Load:
    url: str
    model: str
    workers: int = 3
    limit_s: float = 600.0
    max_requests: int = 50_000
    outcomes: list[Outcome] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._send, args=(n,), daemon=True) for n in range(self.workers)]

    def __enter__(self) -> Load:
        self._deadline = time.monotonic() + self.limit_s
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(90)

    def _send(self, worker: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            sent = 0
            while self._running():
                sent += 1
                body = {"model": self.model, "input": f"load {worker}-{sent}: the quick brown fox"}
                try:
                    response = client.post("/v1/embeddings", json=body)
                    outcome = Outcome(time.monotonic(), response.status_code, response.headers.get("retry-after"),
                                      None if response.is_success else response.text[:300])
                except httpx.HTTPError as exc:
                    outcome = Outcome(time.monotonic(), None, error=f"{type(exc).__name__}: {exc}")
                with self._lock:
                    self.outcomes.append(outcome)
                time.sleep(0.02)  # a steady stream, not a flood: the machine has two cores for everything

    def _running(self) -> bool:
        return not self._stop.is_set() and time.monotonic() < self._deadline and len(self.outcomes) < self.max_requests

    def since(self, start: float) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.at >= start]

    def failed(self, start: float = 0.0) -> list[Outcome]:
        return [o for o in self.since(start) if o.status != 200]

    def succeeded_after(self, start: float) -> bool:
        return any(o.status == 200 for o in self.since(start))
