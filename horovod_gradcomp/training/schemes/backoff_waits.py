"""The asynchronous schemes' waits on MPI requests: tests with a doubling sleep in between.

Open MPI's blocking waits poll the progress engine in a tight loop. The asynchronous
schemes wait often (a service thread per rank, workers waiting for slow peers), on
machines where ranks may share cores, so they test the requests and sleep between tests,
with a delay that doubles from 10 us up to ``max_delay`` (a backoff, unlike the fixed
interval of the exchange's :class:`~horovod_gradcomp.transports.mpi.PollingComm`).
"""
from __future__ import annotations

import threading
import time
from typing import Optional, Sequence


def wait_all(requests: Sequence, max_delay: float = 1e-3, stop: Optional[threading.Event] = None) -> bool:
    """Wait until every request completed; True, or False as soon as ``stop`` is set
    (requests are then left pending, for the caller to cancel)."""
    from mpi4py import MPI
    requests = list(requests)
    delay = 1e-5
    while not MPI.Request.Testall(requests):
        if stop is not None and stop.is_set():
            return False
        time.sleep(delay)
        delay = min(2 * delay, max_delay)
    return True


def wait_one(request, status=None, max_delay: float = 1e-3, stop: Optional[threading.Event] = None) -> bool:
    """Wait for one request (filling ``status``); False as soon as ``stop`` is set."""
    delay = 1e-5
    while not request.Test(status):
        if stop is not None and stop.is_set():
            return False
        time.sleep(delay)
        delay = min(2 * delay, max_delay)
    return True


def barrier(comm, max_delay: float = 1e-3) -> None:
    """A barrier that sleeps while it waits (``Ibarrier`` + polling)."""
    wait_one(comm.Ibarrier(), max_delay=max_delay)
