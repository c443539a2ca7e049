"""The request sequences and their drivers (exchange/requests.py, blocking_driver.py,
ddp/future_driver.py) on fake one-process communicators: what each request becomes, the
``last`` flag, pipelined issues, and the errors."""
from __future__ import annotations

import threading

import pytest
import torch

from horovod_gradcomp.ddp.future_driver import advance, with_known_sizes
from horovod_gradcomp.exchange.blocking_driver import BlockingDriver
from horovod_gradcomp.exchange.requests import Collective, Issue, Wait, passed_on
from horovod_gradcomp.exchange.stats import ExchangeStats
from horovod_gradcomp.transports.torch_dist import Pending


class Recorder:
    """A blocking communicator of two ranks whose collectives record the thread and arguments."""
    size, rank, thread_multiple = 2, 0, True

    def __init__(self):
        self.calls = []

    def allgather(self, send):
        self.calls.append(("allgather", threading.current_thread().name, int(send[0])))
        return torch.stack([send, send])

    def allgatherv(self, send):
        self.calls.append(("allgatherv", threading.current_thread().name, send.numel()))
        return [send, send]


class AsyncRecorder:
    """An asynchronous communicator: every ``<op>_async`` returns an already finished Pending."""
    size, rank = 2, 0

    def __init__(self):
        self.calls = []

    def _done(self, op, value):
        self.calls.append(op)
        return Pending(None, lambda _: value)

    def allgather_async(self, send):
        return self._done("allgather", torch.stack([send, send]))

    def sizes_async(self, n):
        return self._done("sizes", [n, n + 1])

    def allgatherv_known_async(self, send, counts):
        return self._done(("allgatherv_known", tuple(counts)), [send, send])


def chunks(comm, n):
    """Issue n allgathers, then wait for them in order; return the first byte of each row 0."""
    handles = []
    for i in range(n):
        handles.append((yield Issue(Collective("allgather", (torch.tensor([i], dtype=torch.uint8),), comm,
                                               last=i == n - 1))))
    out = []
    for h in handles:
        out.append(int((yield Wait(h))[0, 0]))
    return out


def test_collective_names_a_known_op():
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        Collective("broadcast", (), None)
    assert Collective("allgather", (), None).kind == "allgather"


def test_blocking_driver_issues_on_the_wire_thread_in_order():
    comm = Recorder()
    driver = BlockingDriver(ExchangeStats())
    assert driver.run(chunks(comm, 3)) == [0, 1, 2]
    assert [c[2] for c in comm.calls] == [0, 1, 2]
    assert all(c[1].startswith("hgc-wire") for c in comm.calls) and driver.wire.started


def test_blocking_driver_without_threads_does_issues_at_once():
    comm = Recorder()
    driver = BlockingDriver(ExchangeStats(), threads_allowed=lambda c: False)
    assert driver.run(chunks(comm, 2)) == [0, 1]
    assert all(c[1] == threading.current_thread().name for c in comm.calls) and not driver.wire.started


def test_blocking_driver_waits_out_issued_collectives_on_error():
    comm = Recorder()
    started, release = threading.Event(), threading.Event()

    def slow_allgather(send):
        started.set()
        release.wait(5)
        return Recorder.allgather(comm, send)
    comm.allgather = slow_allgather

    def fails():
        yield Issue(Collective("allgather", (torch.zeros(1, dtype=torch.uint8),), comm))
        started.wait(5)
        threading.Timer(0.2, release.set).start()
        raise RuntimeError("encode failed")
    with pytest.raises(RuntimeError, match="encode failed"):
        BlockingDriver(ExchangeStats()).run(fails())
    assert len(comm.calls) == 1   # the collective in flight ended before run() raised


def test_blocking_driver_refuses_other_requests():
    def odd():
        yield "allgather please"
    with pytest.raises(TypeError, match="not a Collective, Issue or Wait"):
        BlockingDriver(ExchangeStats()).run(odd())


def test_passed_on_clears_last_and_keeps_the_result():
    comm = Recorder()
    seen = []

    def outer():
        value = yield from passed_on(chunks(comm, 2))
        seen.append(value)
        yield Collective("allgatherv", (torch.zeros(3, dtype=torch.uint8),), comm, last=True)
    steps = outer()
    requests, answer = [], None
    driver = BlockingDriver(ExchangeStats(), threads_allowed=lambda c: False)
    try:
        while True:
            request = steps.send(answer)
            requests.append(request)
            answer = driver.run(iter_one(request))
    except StopIteration:
        pass
    lasts = [(r.collective if isinstance(r, Issue) else r).last for r in requests if not isinstance(r, Wait)]
    assert lasts == [False, False, True] and seen == [[0, 1]]


def iter_one(request):
    """A sequence of the one request, returning its answer."""
    return (yield request)


def test_future_driver_stops_at_each_wait_and_marks_last_out():
    comm = AsyncRecorder()
    steps = chunks(comm, 2)
    first = advance(steps, None)   # both issued, stopped at the first wait
    assert comm.calls == ["allgather", "allgather"] and first.last_out
    second = advance(steps, first.pending.wait())
    assert not second.last_out
    with pytest.raises(StopIteration) as stop:
        advance(steps, second.pending.wait())
    assert stop.value.value == [0, 1]


def test_future_driver_splits_an_allgatherv_into_sizes_and_known():
    comm = AsyncRecorder()

    def variable():
        parts = yield Collective("allgatherv", (torch.zeros(4, dtype=torch.uint8),), comm, "payload", last=True)
        return len(parts)
    steps = with_known_sizes(variable())
    sizes = advance(steps, None)
    assert comm.calls == ["sizes"] and sizes.kind == "sizes" and not sizes.last_out
    data = advance(steps, sizes.pending.wait())
    assert comm.calls[1] == ("allgatherv_known", (4, 5)) and data.kind == "payload" and data.last_out
    with pytest.raises(StopIteration) as stop:
        advance(steps, data.pending.wait())
    assert stop.value.value == 2
