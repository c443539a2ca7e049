"""Daemon threads that run posted calls and end when idle: the DDP hook's sequencer and waiters.

A :class:`DaemonThreads` starts a thread when a call is posted and no thread of it is free (up
to ``limit``: with ``limit=1`` the calls run one at a time, in the order posted), and a thread
ends after ``idle_s`` seconds without a call, so a state no longer used leaves no thread behind.

:meth:`DaemonThreads.wait_idle` is for the interpreter's exit: a daemon thread that is inside
torch (a collective's wait, a future's completion, freeing a tensor) when Python shuts down can be
ended by the C++ runtime's ``terminate``; a thread blocked on the pool's queue is only in Python's
own code, which shuts down cleanly. A thread lets go of a call's arguments before it counts as
idle, so an idle thread holds no tensor that its exit would free.
"""
from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Callable, Optional


class DaemonThreads:
    """Run ``fn(*args)`` posted by :meth:`post` on daemon threads named ``name``.

    Args:
        name: the threads' name.
        limit: most threads at once (None: one per call waiting); 1 keeps the posting order.
        setup: called first on every new thread (e.g. ``torch.cuda.set_device``).
        on_error: called with any exception a call raises (default: print its traceback); the
            thread goes on.
        idle_s: a thread ends after this many seconds without a call.
    """

    def __init__(self, name: str, limit: Optional[int] = None, setup: Optional[Callable[[], None]] = None,
                 on_error: Optional[Callable[[BaseException], None]] = None, idle_s: float = 2.0):
        self.name = name
        self._limit = limit
        self._setup = setup
        self._on_error = on_error
        self._idle_s = idle_s
        self._queue: "queue.SimpleQueue" = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0    # alive
        self._idle = 0       # blocked on the queue
        self._pending = 0    # posted, not taken yet
        self._busy = 0       # running a call

    def post(self, fn: Callable, *args) -> None:
        """Queue ``fn(*args)``; start a thread if none is free and the limit allows."""
        with self._lock:
            self._queue.put((fn, args))
            self._pending += 1
            spawn = self._pending > self._idle and (self._limit is None or self._threads < self._limit)
            if spawn:
                self._threads += 1
        if spawn:
            threading.Thread(target=self._main, name=self.name, daemon=True).start()

    def wait_idle(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until no call is running or waiting; True if so."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if self._busy == 0 and self._pending == 0:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def _main(self) -> None:
        if self._setup is not None:
            self._setup()
        while True:
            with self._lock:
                self._idle += 1
            try:
                fn, args = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    self._idle -= 1
                    if self._pending == 0:
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._idle -= 1
                self._pending -= 1
                self._busy += 1
            try:
                fn(*args)
            except BaseException as exc:  # noqa: BLE001 - the thread must go on serving its callers
                if self._on_error is not None:
                    self._on_error(exc)
                else:
                    traceback.print_exc()
            finally:
                # Drop the call and its arguments (a bucket's gradients) while still counted busy:
                # a thread that ends when idle must free no tensor, since freeing one can release
                # the GIL inside torch, and once Python finalizes that ends in terminate.
                del fn, args
                with self._lock:
                    self._busy -= 1
