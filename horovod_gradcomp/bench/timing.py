"""Timing of a bench's measured steps: wall-clock seconds per step and the CPU time they took.

The CPU time is this process's (every thread: the main one, the exchange and wire threads,
Horovod's background thread), so on a machine whose ranks share cores it is the share of the
cores one rank demanded; the cost model scales it to other rank counts (``bench model``).
"""
from __future__ import annotations

import time
from typing import Callable

#: The learning rate of every bench's optimizer steps: small enough that the parameters (and so the
#: gradients the next step exchanges) barely move over a run, yet a real update that the optimizer applies.
LR = 1e-9


def timed_steps(step: Callable[[], object], steps: int) -> dict:
    """Run ``step`` ``steps`` times: ``{"seconds": [wall seconds of each], "cpu_seconds": process
    CPU seconds per step over all of them}``."""
    seconds = []
    cpu0 = time.process_time()
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - t0)
    return {"seconds": seconds, "cpu_seconds": (time.process_time() - cpu0) / max(steps, 1)}
