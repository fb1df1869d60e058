"""Processes as Linux's /proc shows them: the process group the launcher cleans up after a Triton dies
(its Python-backend stubs), and the trees, states and CPU times the tests and benchmarks read. Where there
is no /proc, no process is found."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (which may hold spaces and parentheses):
    [0] the state, [1] the parent's pid, [2] the process group, [11] and [12] user and system clock ticks.
    OSError when there is no such process."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def processes() -> dict[int, list[str]]:
    """Every process's stat fields, by pid (one that ends while they are read is left out)."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            found[int(entry.name)] = stat_fields(entry.name)
        except (OSError, IndexError):
            continue
    return found


def children(pid: int) -> list[int]:
    return sorted(child for child, fields in processes().items() if int(fields[1]) == pid)


def group(pgid: int) -> list[int]:
    """The processes of process group `pgid`."""
    return sorted(member for member, fields in processes().items() if int(fields[2]) == pgid)


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie."""
    try:
        return stat_fields(pid)[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False
