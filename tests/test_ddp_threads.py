"""The DDP hook's threads and pending collectives, single process: calls run in order with
``limit=1``, threads end when idle, ``wait_idle`` sees running calls, and a :class:`Pending`
finishes its result on the thread that waits (never on a backend thread)."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from horovod_gradcomp.ddp.daemon_threads import DaemonThreads
from horovod_gradcomp.transports.torch_dist import Pending


def test_limit_one_keeps_the_posting_order_and_threads_end_when_idle():
    pool = DaemonThreads("t", limit=1, idle_s=0.05)
    seen, names = [], set()

    def record(i):
        seen.append(i)
        names.add(threading.current_thread().ident)
        time.sleep(0.001)
    for i in range(50):
        pool.post(record, i)
    assert pool.wait_idle(10)
    assert seen == list(range(50)) and len(names) == 1
    deadline = time.monotonic() + 5
    while any(t.name == "t" for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(t.name == "t" for t in threading.enumerate()), "an idle thread ends"
    pool.post(record, 50)          # and a new one starts with the next call
    assert pool.wait_idle(10) and seen[-1] == 50


def test_unlimited_pool_runs_blocked_calls_side_by_side():
    pool = DaemonThreads("u", idle_s=0.05)
    gate, started = threading.Event(), []

    def blocked(i):
        started.append(i)
        gate.wait(10)
    for i in range(3):
        pool.post(blocked, i)
    deadline = time.monotonic() + 5
    while len(started) < 3 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert sorted(started) == [0, 1, 2], "three waits in flight at once: one thread each"
    assert not pool.wait_idle(0.05), "calls still running"
    gate.set()
    assert pool.wait_idle(10)


def test_an_idle_thread_holds_no_argument_of_its_last_call():
    """Once wait_idle returns, the threads have let go of the calls' arguments (a tensor freed by
    a thread that ends during the interpreter's exit aborted a DDP suite at -np 4)."""
    import weakref

    class Payload:
        pass
    pool = DaemonThreads("a", limit=1, idle_s=30)
    arg = Payload()
    gone = weakref.ref(arg)
    pool.post(lambda x: None, arg)
    del arg
    assert pool.wait_idle(10)
    assert gone() is None, "the idle thread still refers to its last call's argument"


def test_errors_go_to_on_error_and_the_thread_goes_on():
    errors, done = [], []
    pool = DaemonThreads("e", limit=1, on_error=errors.append, idle_s=0.05)
    pool.post(lambda: 1 / 0)
    pool.post(done.append, "next")
    assert pool.wait_idle(10)
    assert len(errors) == 1 and isinstance(errors[0], ZeroDivisionError) and done == ["next"]


def test_pending_finishes_on_the_waiting_thread_once():
    inner: torch.futures.Future = torch.futures.Future()
    calls = []

    def finish(value):
        calls.append(threading.current_thread().ident)
        return value + 1
    pending = Pending(inner, finish).then(lambda v: v * 10)
    setter = threading.Thread(target=lambda: (time.sleep(0.05), inner.set_result(4)))
    setter.start()
    assert pending.wait() == 50 and pending.wait() == 50
    setter.join()
    assert calls == [threading.current_thread().ident], "finished once, here, not on the completing thread"


def test_pending_raises_the_error_to_every_waiter():
    inner: torch.futures.Future = torch.futures.Future()
    inner.set_exception(ValueError("collective failed"))
    pending = Pending(inner, lambda v: v)
    for _ in range(2):
        with pytest.raises(ValueError, match="collective failed"):
            pending.wait()
