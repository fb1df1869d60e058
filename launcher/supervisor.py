"""Processes that are restarted when they exit: the one restart policy and the bookkeeping behind
`tritongate up` (launcher/stack.py: Triton, the services, the edge) and `tritongate edge --workers N`
(launcher/workers.py).

A process that exits is started again after a delay, and one line at WARNING says which, how it ended,
the restart number and the delay. A process that exits again and again right after starting cannot
start: `heal()` raises CannotStart, and the caller stops everything with that reason. The rule is
supervisord's (`startsecs`, `startretries`): an exit within `quick_exit_s` of the start counts towards
giving up and doubles the next delay; a process that ran longer starts the count again.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger("tritongate.supervisor")

Process = subprocess.Popen[bytes]


class CannotStart(Exception):
    """A component cannot start (e.g. it kept exiting right after it started); the message is one line for
    the user."""


@dataclass(frozen=True)
class RestartPolicy:
    first_delay_s: float = 1.0  # before restarting a process that ran a while
    max_delay_s: float = 30.0
    quick_exit_s: float = 10.0  # an exit this soon after the start is a failure to start
    give_up_after: int = 3  # quick exits in a row that stop everything

    def delay(self, quick_exits: int) -> float:
        """Seconds before the next start, after `quick_exits` quick exits in a row (0: it ran a while)."""
        return min(self.max_delay_s, self.first_delay_s * 2**quick_exits)


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass
class Child:
    """One supervised process. `start` starts it (again); `after_exit` cleans up after an exit and returns
    what more the log line should say ("" for nothing)."""

    name: str
    start: Callable[[], Process]
    after_exit: Callable[[Process], str] | None
    process: Process
    started: float
    quick_exits: int = 0  # in a row
    restarts: int = 0
    restart_at: float | None = None  # a restart is due at this time


@dataclass
class Supervisor:
    policy: RestartPolicy = field(default_factory=RestartPolicy)
    clock: Callable[[], float] = time.monotonic
    children: list[Child] = field(default_factory=list)

    def add(self, name: str, start: Callable[[], Process],
            after_exit: Callable[[Process], str] | None = None) -> Process:
        """Start `name` and watch it from now on (it is restarted only by `heal()`)."""
        process = start()
        self.children.append(Child(name, start, after_exit, process, self.clock()))
        return process

    def heal(self) -> None:
        """Note the processes that exited, and start those whose delay is over; CannotStart when one
        exited `give_up_after` times in a row right after starting."""
        for child in self.children:
            if child.restart_at is None and child.process.poll() is not None:
                self._exited(child)
            elif child.restart_at is not None and self.clock() >= child.restart_at:
                child.process, child.started, child.restart_at = child.start(), self.clock(), None

    def _exited(self, child: Child) -> None:
        now = self.clock()
        ran = now - child.started
        child.quick_exits = child.quick_exits + 1 if ran < self.policy.quick_exit_s else 0
        detail = child.after_exit(child.process) if child.after_exit else ""
        ended = how_it_ended(child.process.returncode)
        if child.quick_exits >= self.policy.give_up_after:
            raise CannotStart(f"{child.name} cannot start: it stopped within {self.policy.quick_exit_s:g} s of "
                              f"starting {child.quick_exits} times in a row; the last time it {ended}"
                              + (f": {detail}" if detail else ""))
        delay = self.policy.delay(child.quick_exits)
        child.restarts += 1
        child.restart_at = now + delay
        log.warning("%s %s after %.1f s; restart %d in %g s%s", child.name, ended, ran, child.restarts, delay,
                    f" ({detail})" if detail else "")

    def watch(self, stopping: Callable[[], bool], interval_s: float = 0.5) -> None:
        """Heal until `stopping()` says so (a restart still waiting for its delay is then dropped)."""
        while not stopping():
            self.heal()
            time.sleep(interval_s)

    def release(self, name: str) -> None:
        """Stop watching `name` (its owner stops it in its own way)."""
        self.children = [child for child in self.children if child.name != name]

    def stop(self, grace_s: float) -> None:
        """SIGTERM to every process, last started first; those still running after `grace_s` are killed.
        Nothing is watched afterwards."""
        children, self.children = self.children, []
        running = [child.process for child in reversed(children) if child.process.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
