"""The Python-backend stub processes of a running Triton, by model. Triton 2.51 does not restart a stub
that dies (it answers "Stub process ... is not healthy" for that model from then on, and still reports
the model ready), so a failed run says which ones died."""

from __future__ import annotations

import contextlib
from pathlib import Path

from tritongate import procs

_STUB = "triton_python_backend_stub"


def python_stubs(triton_pid: int) -> dict[int, str]:
    """{pid: model} of the stubs that `triton_pid` started (the model is its `model.py`'s folder's)."""
    stubs: dict[int, str] = {}
    for pid in procs.children(triton_pid):
        with contextlib.suppress(OSError, IndexError):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if args[0].decode().endswith(_STUB):
                stubs[pid] = Path(args[1].decode()).parent.parent.name
    return stubs


def dead(stubs: dict[int, str]) -> list[str]:
    """The models of `stubs` whose process has exited (a zombie included: Triton does not reap it)."""
    return sorted(model for pid, model in stubs.items() if not procs.alive(pid))
