"""A clock for the unit tests that moves only when told (`clock.now += 2`): stands in for
time.monotonic, time.perf_counter or a clock parameter."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now
