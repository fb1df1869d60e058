"""Whether this process is busy: what decides whether the batching of the edge and of the services
(tritongate/batching.py) holds requests back for a call slot.

Holding requests until a call returns makes fewer, larger calls: it saves the CPU each call costs, which
is what limits the rate when the process is busy (a fast model, e.g. on a GPU). A process with CPU to
spare is not what limits the rate, and holding there would only keep requests from a slow model (tens of
milliseconds a call, e.g. on a CPU) whose own batcher would merge them as soon as an instance is free:
Triton's batches come out smaller, and the model pays per row."""

from __future__ import annotations

import time
from collections.abc import Callable

# From this share of one core (all the process's threads, over the last WINDOW_S) a process counts as
# busy. A gateway process in front of a slow model uses about a tenth of a core; one that limits the
# rate, most of one.
BUSY_CORES = 0.3
WINDOW_S = 0.5


class ProcessBusy:
    """Whether this process used at least `cores` of CPU time per second of wall time over its last
    window (read again once the window has passed, so that asking costs a clock read)."""

    def __init__(self, cores: float = BUSY_CORES, window: float = WINDOW_S,
                 cpu: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic) -> None:
        self.cores = cores
        self.window = window
        self._cpu = cpu
        self._clock = clock
        self._since = clock()
        self._cpu_since = cpu()
        self._busy = False

    def __call__(self) -> bool:
        now = self._clock()
        if now - self._since >= self.window:
            spent = self._cpu()
            self._busy = (spent - self._cpu_since) / (now - self._since) >= self.cores
            self._since, self._cpu_since = now, spent
        return self._busy
