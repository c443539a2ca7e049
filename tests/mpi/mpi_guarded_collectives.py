"""Every collective the package issues runs inside an exchange, under the stall watchdog
(mpirun -np 1..4).

The communicators are wrapped: the mpi4py communicator that the default :class:`MPICommunicator`
duplicates (and its duplicate), and Horovod's collectives behind :class:`HorovodCommunicator`.
Any collective call made while no watchdog guard is open (at construction, from a property, in
a factory) is recorded as a violation, and so is any call at all while the compressions are
being built.
"""
from __future__ import annotations

import threading

import horovod.torch as hvd
import pytest
import torch
from mpi4py import MPI

import horovod_gradcomp as hgc
from horovod_gradcomp.transports import mpi as mpi_transport
from horovod_gradcomp.transports.mpi import MPICommunicator
from horovod_gradcomp.transports.mpi_polling import PollingCommunicator
from horovod_gradcomp.exchange.watchdog import default_watchdog
from horovod_gradcomp.transports import horovod_ops

from .mpi_helpers import init

RANK, SIZE = init()
LOCAL = {"Get_rank", "Get_size", "Get_group", "Get_name", "Is_inter", "Is_intra", "py2f"}
CODECS = {
    "onebit": {"pattern": "two_phase", "pipeline_bytes": 64},
    "terngrad": {},
    "qsgd": {"bits": 4, "coding": "elias"},
    "dgc": {"density": 0.2, "momentum": 0.9, "check_optimizer": False, "bucket_bytes": 200},
}


class Recorder:
    """Every call seen, and those made outside a watchdog guard."""

    def __init__(self):
        self.calls, self.violations = [], []
        self._lock = threading.Lock()

    def note(self, what: str) -> None:
        with self._lock:
            self.calls.append(what)
            if not default_watchdog().active():
                self.violations.append(f"{what} outside an exchange (thread {threading.current_thread().name})")


class WatchedComm:
    """An mpi4py communicator whose every non-local call is recorded; ``Dup`` returns another."""

    def __init__(self, comm, recorder: Recorder):
        self._comm, self._recorder = comm, recorder

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name in LOCAL or not callable(attr):
            return attr

        def call(*args, **kwargs):
            self._recorder.note(f"MPI {name}")
            out = attr(*args, **kwargs)
            return WatchedComm(out, self._recorder) if name == "Dup" else out
        return call


class WatchedHorovod:
    """``horovod.torch`` with its collectives recorded."""

    COLLECTIVES = ("allgather", "alltoall", "allreduce", "grouped_allreduce", "broadcast", "barrier")

    def __init__(self, recorder: Recorder):
        self._recorder = recorder

    def __getattr__(self, name):
        attr = getattr(hvd, name)
        if name not in self.COLLECTIVES:
            return attr

        def call(*args, **kwargs):
            self._recorder.note(f"Horovod {name}")
            return attr(*args, **kwargs)
        return call


@pytest.fixture
def recorder(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(mpi_transport, "_DEFAULT", MPICommunicator(base=WatchedComm(MPI.COMM_WORLD, rec)))
    original = horovod_ops.HorovodCommunicator.__init__

    def watched_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._hvd = WatchedHorovod(rec)
    monkeypatch.setattr(horovod_ops.HorovodCommunicator, "__init__", watched_init)
    yield rec
    assert not rec.violations, rec.violations


def train(model, comp, steps=2):
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    for step in range(steps):
        g = torch.Generator().manual_seed(10 * step + RANK)
        opt.zero_grad()
        model(torch.randn(4, 6, generator=g)).pow(2).sum().backward()
        opt.step()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


@pytest.mark.parametrize("transport", ["mpi", "horovod"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_no_collective_outside_an_exchange(recorder, codec, transport, tmp_path):
    model = make_model()
    comp = getattr(hgc.Compression, codec)(model.named_parameters(), transport=transport, timeout=60,
                                           **CODECS[codec])
    repr(comp), comp.stats(), comp.state_dict(), comp.communicator.rank, comp.communicator.size
    assert recorder.calls == [], f"building {codec} issued {recorder.calls}"
    train(model, comp)  # through Horovod's hooks (at -np 1 Horovod registers none)
    comp.exchange({n: torch.randn(p.shape) for n, p in model.named_parameters()})
    hgc.save_job_state(comp, str(tmp_path / f"state-{RANK}.pt"))
    if SIZE > 1:  # (a world of one exchanges without collectives)
        assert recorder.calls, "the wrapped communicator saw no collective: the test checks nothing"


def test_the_duplicate_is_made_by_the_first_exchange(recorder):
    """The default communicator duplicates COMM_WORLD once, at the first exchange, inside the guard."""
    model = make_model()
    comm = PollingCommunicator(interval_s=1e-4, base=WatchedComm(MPI.COMM_WORLD, recorder))
    comps = [hgc.Compression.onebit(model.named_parameters(), timeout=60),
             hgc.Compression.qsgd(model.named_parameters(), communicator=comm, timeout=60)]
    assert recorder.calls == [] and not comm.connected
    with pytest.raises(RuntimeError, match="no duplicate yet"):
        comm.comm
    for comp in comps:
        comp.exchange({n: torch.randn(p.shape) for n, p in model.named_parameters()})
    assert recorder.calls.count("MPI Dup") == 2 and comm.connected
    assert recorder.calls[0] == "MPI Dup"


@pytest.mark.parametrize("scheme", ["averaging", "easgd"])
def test_synchronous_schemes_collectives_run_under_the_watchdog(recorder, scheme):
    """The schemes' collectives (construction, step, finish) on a wrapped COMM_WORLD."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    comm = WatchedComm(MPI.COMM_WORLD, recorder)
    if scheme == "averaging":
        s = hgc.ModelAveraging(model, opt, period=2, codec="onebit", comm=comm, timeout=60)
    else:
        s = hgc.EASGD(model, opt, period=2, codec="onebit", comm=comm, timeout=60)
    for step in range(4):
        opt.zero_grad()
        model(torch.randn(4, 6)).pow(2).sum().backward()
        s.step()
    s.finish()
    assert "MPI Dup" in recorder.calls and len(recorder.calls) > 3, recorder.calls
