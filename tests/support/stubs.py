"""The Python-backend stub processes of a running Triton, by model. Triton 2.51 does not restart a stub
that dies (it answers "Stub process ... is not healthy" for that model from then on, and still reports
the model ready), so a failed run says which ones died."""

from __future__ import annotations

import contextlib
from pathlib import Path

_STUB = "triton_python_backend_stub"


def python_stubs(triton_pid: int) -> dict[int, str]:
    """{pid: model} of the stubs that `triton_pid` started (the model is its `model.py`'s folder's)."""
    stubs: dict[int, str] = {}
    if not Path("/proc").is_dir():  # not Linux: nothing to say
        return stubs
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            if int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1]) != triton_pid:
                continue
            args = (proc / "cmdline").read_bytes().split(b"\0")
            if args[0].decode().endswith(_STUB):
                stubs[int(proc.name)] = Path(args[1].decode()).parent.parent.name
    return stubs


def dead(stubs: dict[int, str]) -> list[str]:
    """The models of `stubs` whose process has exited (a zombie included: Triton does not reap it)."""
    return sorted(model for pid, model in stubs.items() if not _running(pid))


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
