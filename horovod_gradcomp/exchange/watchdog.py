"""Deadlines on the exchange's waits: a rank that stops taking part must not hang the others.

Every bucket runs inside :meth:`StallWatchdog.guard`. One daemon thread per process watches
the open guards: at half the timeout it warns once (as Horovod's stall inspector does), at the
timeout it prints an error naming the step, the bucket and the ranks this rank was waiting
for, and aborts the MPI job (``MPI_Abort``), so that ``mpirun`` ends instead of hanging. A
blocked collective cannot be interrupted from Python, so aborting is the only exit.

The timeout is ``timeout=`` of the compression factories, else the environment variable
``HOROVOD_GRADCOMP_STALL_TIMEOUT`` (seconds), else :data:`DEFAULT_TIMEOUT_S`; 0 disables it.
"""
from __future__ import annotations

import itertools
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Dict, Optional

from ..transports.mpi_lifetime import abort_at_exit_while, mpi_abort
from .env import seconds_from_env

DEFAULT_TIMEOUT_S = 300.0
ENV_VAR = "HOROVOD_GRADCOMP_STALL_TIMEOUT"


def resolve_timeout(timeout: Optional[float]) -> float:
    """``timeout`` if given, else the environment variable, else the default (seconds; 0 = off)."""
    if timeout is None:
        timeout = seconds_from_env(ENV_VAR, "no deadline")
        if timeout is None:
            return DEFAULT_TIMEOUT_S
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0 (0: no deadline), got {timeout!r}")
    return float(timeout)


class StallWatchdog:
    """Watches guarded waits; see the module doc. ``on_stall(message)`` defaults to :func:`mpi_abort`."""

    def __init__(self, on_stall: Callable[[str], None] = mpi_abort):
        self.on_stall = on_stall
        self._open: Dict[int, list] = {}   # id -> [deadline, warn_at, timeout, what, warned]
        self._ids = itertools.count()
        self._cv = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        self._active = 0   # guards open now, with or without a deadline

    def active(self) -> bool:
        """True while some thread of this process is inside :meth:`guard` (an exchange is running)."""
        return self._active > 0

    @contextmanager
    def guard(self, timeout: float, what: str):
        """Run the ``with`` block under a deadline of ``timeout`` seconds (0: none). ``what``
        names the wait in the messages (step, bucket, ranks waited for)."""
        key = next(self._ids)
        with self._cv:
            self._active += 1
            if timeout:
                now = time.monotonic()
                self._open[key] = [now + timeout, now + timeout / 2, timeout, what, False]
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name="hgc-watchdog", daemon=True)
                    self._thread.start()
                self._cv.notify_all()
        try:
            yield
        finally:
            with self._cv:
                self._active -= 1
                self._open.pop(key, None)

    def _watch(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                fired = None
                for entry in self._open.values():
                    deadline, warn_at, timeout, what, warned = entry
                    if now >= deadline:
                        fired = (timeout, what)
                        break
                    if now >= warn_at and not warned:
                        entry[4] = True
                        print(f"horovod_gradcomp: WARNING: waiting for {timeout / 2:.0f} s in {what}; the job is "
                              f"aborted at {timeout:.0f} s ({ENV_VAR} or timeout= to change)", file=sys.stderr,
                              flush=True)
                if fired is None:
                    nxt = [e[0] if e[4] else e[1] for e in self._open.values()]
                    self._cv.wait(timeout=max(0.05, min(nxt) - now) if nxt else None)
                    continue
            timeout, what = fired
            self.on_stall(f"horovod_gradcomp: StallError: no progress for {timeout:.0f} s in {what}; aborting the "
                          f"MPI job (set {ENV_VAR} or timeout= to change the deadline)")
            return


_WATCHDOG: Optional[StallWatchdog] = None


def default_watchdog() -> StallWatchdog:
    """The process-wide watchdog (one thread for every compression object). An MPI process that
    exits while one of its guards is open aborts the job
    (:func:`~horovod_gradcomp.transports.mpi_lifetime.abort_at_exit_while`)."""
    global _WATCHDOG
    if _WATCHDOG is None:
        _WATCHDOG = StallWatchdog()
        abort_at_exit_while(_WATCHDOG.active)
    return _WATCHDOG
