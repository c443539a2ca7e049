"""The stall watchdog of jobs launched by torch.distributed (torchrun and the like): DDP and FSDP2.

Under such a launcher there is no MPI job to abort, so the watchdog's action
(:class:`~horovod_gradcomp.exchange.watchdog.StallWatchdog`'s ``on_stall``) prints the message and
ends this process with exit status :data:`STALL_EXIT_STATUS`; the launcher then ends the other
ranks. A collective blocked in gloo or NCCL cannot be interrupted from Python, so ending the
process is the only way out of it.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from ..exchange.watchdog import StallWatchdog

#: The exit status of a process the watchdog ends.
STALL_EXIT_STATUS = 70

_WATCHDOG: Optional[StallWatchdog] = None


def exit_on_stall(message: str) -> None:
    """Print ``message`` (naming the wait that stalled) and end this process."""
    print(message.replace("aborting the MPI job", "ending this process"), file=sys.stderr, flush=True)
    os._exit(STALL_EXIT_STATUS)


def process_watchdog() -> StallWatchdog:
    """The process-wide watchdog whose stall action is :func:`exit_on_stall` (one thread for every
    DDP hook and FSDP2 state of the process)."""
    global _WATCHDOG
    if _WATCHDOG is None:
        _WATCHDOG = StallWatchdog(on_stall=exit_on_stall)
    return _WATCHDOG
