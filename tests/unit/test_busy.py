"""ProcessBusy (tritongate/batching.py): the share of a core this process used over its last window, which
decides whether the edge's coalescer and the services' batcher hold requests for a call slot."""

from __future__ import annotations

from tritongate.batching import ProcessBusy


def test_busy_is_a_share_of_one_core_over_the_last_window() -> None:
    clock, cpu = [0.0], [0.0]
    busy = ProcessBusy(cores=0.3, window=0.5, cpu=lambda: cpu[0], clock=lambda: clock[0])
    assert not busy()  # nothing measured yet
    clock[0], cpu[0] = 0.5, 0.1  # 0.2 of a core
    assert not busy()
    clock[0], cpu[0] = 1.0, 0.3  # 0.4 of a core
    assert busy()
    clock[0], cpu[0] = 1.2, 1.0  # within the window: the last reading stands
    assert busy()
    clock[0], cpu[0] = 2.0, 1.1  # since the reading at 1.0 s: 0.8 s of CPU in 1 s
    assert busy()
    clock[0], cpu[0] = 3.0, 1.2  # 0.1 of a core
    assert not busy()
