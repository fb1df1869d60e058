"""tritongate/procs.py on real processes: a child found by its parent and its group, alive until it
ends, and gone once reaped."""

from __future__ import annotations

import os
import subprocess
import sys

from tritongate import procs


def test_a_child_is_found_by_parent_and_group_and_is_alive_until_it_ends() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        assert child.pid in procs.children(os.getpid())
        assert procs.group(child.pid) == [child.pid]  # its own session: the group it leads
        assert procs.alive(child.pid) and int(procs.stat_fields(child.pid)[1]) == os.getpid()
        child.kill()
        child.wait()
        assert not procs.alive(child.pid) and child.pid not in procs.children(os.getpid())
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
