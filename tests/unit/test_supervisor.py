"""The restart policy of `tritongate up` and `tritongate edge --workers N` (launcher/supervisor.py), on a fake
clock and fake processes; stopping on real ones."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from launcher.supervisor import CannotStart, RestartPolicy, Supervisor
from tests.support.clock import Clock


@dataclass
class FakeProcess:
    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class Component:
    """Starts FakeProcesses and remembers them; `exits` lets the current one end."""

    started: list[FakeProcess] = field(default_factory=list)
    cleaned: list[int] = field(default_factory=list)

    def start(self) -> Any:
        self.started.append(FakeProcess(pid=100 + len(self.started)))
        return self.started[-1]

    def exits(self, code: int) -> None:
        self.started[-1].returncode = code

    def after_exit(self, process: Any) -> str:
        self.cleaned.append(process.pid)
        return "the detail"


def supervised(clock: Clock, **policy: Any) -> tuple[Supervisor, Component]:
    supervisor = Supervisor(RestartPolicy(**policy), clock)
    component = Component()
    supervisor.add("embed", component.start, component.after_exit)
    return supervisor, component


def test_the_delay_doubles_with_each_quick_exit_up_to_the_cap() -> None:
    policy = RestartPolicy(first_delay_s=1, max_delay_s=5)
    assert [policy.delay(n) for n in range(5)] == [1, 2, 4, 5, 5]


def test_a_process_that_ran_a_while_is_restarted_after_the_first_delay_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    supervisor, embed = supervised(clock)
    clock.now = 60
    embed.exits(-signal.SIGKILL)
    with caplog.at_level(logging.WARNING, "tritongate.supervisor"):
        supervisor.heal()
    assert caplog.messages == ["embed was killed by SIGKILL after 60.0 s; restart 1 in 1 s (the detail)"]
    assert embed.cleaned == [100]
    clock.now = 60.9
    supervisor.heal()
    assert len(embed.started) == 1  # not before its delay
    clock.now = 61
    supervisor.heal()
    assert len(embed.started) == 2 and supervisor.children[0].process is embed.started[1]


def test_three_quick_exits_in_a_row_give_up_with_the_reason(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    supervisor, embed = supervised(clock)
    delays = []
    for _ in range(2):
        clock.now += 2  # each run is shorter than quick_exit_s
        embed.exits(1)
        supervisor.heal()
        restart_at = supervisor.children[0].restart_at
        assert restart_at is not None
        delays.append(restart_at - clock.now)
        clock.now = restart_at
        supervisor.heal()
    assert delays == [2, 4] and len(embed.started) == 3
    clock.now += 2
    embed.exits(1)
    with pytest.raises(CannotStart, match=r"^embed cannot start: it stopped within 10 s of starting 3 times in a "
                                          r"row; the last time it exited with code 1: the detail$"):
        supervisor.heal()
    assert embed.cleaned == [100, 101, 102]


def test_a_run_longer_than_quick_exit_s_starts_the_count_again() -> None:
    clock = Clock()
    supervisor, embed = supervised(clock)
    for run_s in (1, 1, 30, 1, 1, 30, 1):  # never three quick exits in a row
        clock.now += run_s
        embed.exits(1)
        supervisor.heal()
        restart_at = supervisor.children[0].restart_at
        assert restart_at is not None
        assert restart_at - clock.now == (1 if run_s == 30 else 2 ** supervisor.children[0].quick_exits)
        clock.now = restart_at
        supervisor.heal()
    assert supervisor.children[0].restarts == 7 and len(embed.started) == 8


def test_a_pending_restart_is_dropped_when_the_supervisor_stops() -> None:
    clock = Clock()
    supervisor, embed = supervised(clock)
    embed.exits(-signal.SIGKILL)
    supervisor.heal()
    supervisor.stop(grace_s=1)
    clock.now = 100
    supervisor.heal()
    assert len(embed.started) == 1 and supervisor.children == []


def test_watch_heals_until_told_to_stop() -> None:
    clock = Clock()
    supervisor, embed = supervised(clock, first_delay_s=0)
    embed.exits(0)
    rounds = iter([False, False, True])
    supervisor.watch(lambda: next(rounds), interval_s=0)
    assert len(embed.started) == 2  # noted the exit, then restarted it, then stopped


def test_stop_terminates_real_processes_and_kills_those_that_ignore_sigterm() -> None:
    ignores = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    supervisor = Supervisor()
    polite = supervisor.add("polite", lambda: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    stubborn = supervisor.add("stubborn", lambda: subprocess.Popen([sys.executable, "-c", ignores],
                                                                   stdout=subprocess.PIPE))
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # its handler is in place
    supervisor.stop(grace_s=1)
    stubborn.stdout.close()
    assert polite.returncode == -signal.SIGTERM and stubborn.returncode == -signal.SIGKILL
