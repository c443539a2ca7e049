"""The Horovod transport against the mpi4py one under mpirun (-np 1, 2, 3, 4).

Every codec and both patterns run the same gradients through two compressions that differ
only in ``transport=``: results, residuals and payload counters must be bitwise equal (the
transport moves bytes; nothing else may change). The Horovod communicator's collectives are
also checked one by one against what every rank can compute from seeds.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.errors import ExchangeMismatchError
from horovod_gradcomp.transports.mpi import MPICommunicator
from horovod_gradcomp.exchange.blocking_driver import BlockingDriver
from horovod_gradcomp.exchange.preamble import preamble_steps
from horovod_gradcomp.exchange.stats import ExchangeStats
from horovod_gradcomp.transports import select_communicator
from horovod_gradcomp.transports.horovod_ops import HorovodCommunicator

from .mpi_helpers import assert_alltoallv_uneven, gather_tensors, init

RANK, SIZE = init()


def bucket_preamble(comm, *args):
    """The preamble's request sequence run at once (the blocking driver, collectives on this thread)."""
    return BlockingDriver(ExchangeStats()).run(preamble_steps(comm, *args))


SHAPES = {"a.bias": (5,), "b.weight": (7, 3), "c.conv": (16, 3, 3, 3), "d.one": (1,), "e.empty": (0,),
          "f.scalar": (), "g.wide": (4, 40)}
NAMES = sorted(SHAPES)
STEPS = 3

CASES = {  # id: (factory, options)
    "onebit-allgather": ("onebit", {}),
    "onebit-two_phase": ("onebit", {"pattern": "two_phase"}),
    "onebit-noef-buckets": ("onebit", {"error_feedback": False, "bucket_bytes": 600}),
    "terngrad-allgather": ("terngrad", {"seed": 3}),
    "terngrad-two_phase-ef": ("terngrad", {"seed": 4, "error_feedback": True, "pattern": "two_phase"}),
    "qsgd-allgather": ("qsgd", {"bits": 4, "bucket": 16, "seed": 5}),
    "qsgd-two_phase": ("qsgd", {"bits": 2, "bucket": 8, "seed": 6, "pattern": "two_phase"}),
    "qsgd-elias": ("qsgd", {"bits": 4, "coding": "elias", "seed": 7}),
    "dgc": ("dgc", {"density": 0.05, "momentum": 0.9, "check_optimizer": False, "seed": 8}),
    "auto-pattern": ("onebit", {"pattern": "auto"}),
    # pipelined chunks: the collectives come from the wire thread on either transport
    "onebit-pipelined": ("onebit", {"pipeline_bytes": 1}),
    "terngrad-two_phase-pipelined": ("terngrad", {"seed": 4, "error_feedback": True, "pattern": "two_phase",
                                                  "pipeline_bytes": 1}),
}


def params():
    return [(n, torch.nn.Parameter(torch.zeros(SHAPES[n]))) for n in NAMES]


def grad(step, rank, name):
    gen = torch.Generator().manual_seed(10_000 * step + 100 * rank + NAMES.index(name))
    return torch.randn(SHAPES[name], generator=gen) * (1 + NAMES.index(name)) + 0.1 * rank


def build(factory, options, transport):
    return getattr(hgc.Compression, factory)(params(), transport=transport, **options)


def flat_state(state):
    """Every tensor of a state_dict (nested dicts), in key order."""
    out = []
    for key in sorted(state, key=str):
        v = state[key]
        if isinstance(v, dict):
            out += [(f"{key}.{k}", t) for k, t in flat_state(v)]
        elif isinstance(v, torch.Tensor):
            out.append((str(key), v))
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_horovod_transport_matches_mpi_bitwise(case):
    factory, options = CASES[case]
    by_mpi, by_hvd = build(factory, options, "mpi"), build(factory, options, "horovod")
    assert isinstance(by_mpi.communicator, MPICommunicator)
    assert isinstance(by_hvd.communicator, HorovodCommunicator)
    for step in range(STEPS):
        grads = {n: grad(step, RANK, n) for n in NAMES}
        got_mpi = by_mpi.exchange({n: g.clone() for n, g in grads.items()})
        got_hvd = by_hvd.exchange({n: g.clone() for n, g in grads.items()})
        for n in NAMES:
            assert got_hvd[n].shape == SHAPES[n]
            assert torch.equal(got_hvd[n], got_mpi[n]), f"{case} step {step}: {n} differs between transports"
        every = gather_tensors(torch.cat([got_hvd[n].reshape(-1) for n in NAMES]))
        assert all(torch.equal(every[r], every[0]) for r in range(SIZE)), f"{case}: ranks disagree"
    s_mpi, s_hvd = flat_state(by_mpi.state_dict()), flat_state(by_hvd.state_dict())
    assert [k for k, _ in s_mpi] == [k for k, _ in s_hvd]
    for (k, a), (_, b) in zip(s_mpi, s_hvd):
        assert torch.equal(a, b), f"{case}: state {k} differs between transports"
    st_mpi, st_hvd = by_mpi.stats(), by_hvd.stats()
    for key in ("steps", "tensors", "bytes_payload", "bytes_payload_dense", "bytes_sent", "bytes_dense"):
        assert st_hvd[key] == st_mpi[key], (key, st_mpi, st_hvd)


def test_horovod_collectives_one_by_one():
    comm = HorovodCommunicator()
    assert (comm.rank, comm.size) == (RANK, SIZE)
    part = lambda r: torch.arange(3 * r, dtype=torch.int64).to(torch.uint8) + r  # noqa: E731 (rank 0: empty)
    got = comm.allgatherv(part(RANK))
    assert len(got) == SIZE and all(torch.equal(got[r], part(r)) for r in range(SIZE))
    rows = comm.allgather(torch.full((6,), RANK, dtype=torch.uint8))
    assert torch.equal(rows, torch.arange(SIZE, dtype=torch.uint8).repeat_interleave(6).reshape(SIZE, 6))
    counts = [r + 1 for r in range(SIZE)]
    got = comm.allgatherv_known(torch.full((RANK + 1,), 7 * RANK, dtype=torch.uint8), counts)
    assert all(torch.equal(got[r], torch.full((r + 1,), 7 * r, dtype=torch.uint8)) for r in range(SIZE))
    assert_alltoallv_uneven(comm)
    values = np.array([RANK, -RANK, 0.5 * (RANK % 2), 1e300 if RANK == SIZE - 1 else -1.0])
    assert np.array_equal(comm.allreduce_max(values), [SIZE - 1, 0, 0.5 if SIZE > 1 else 0.0, 1e300])
    assert bucket_preamble(comm, "same", ["x", "y"], False) is False


@pytest.mark.skipif(SIZE < 2, reason="a mismatch needs two ranks")
def test_disagreement_raises_on_every_rank():
    comm = HorovodCommunicator()
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        bucket_preamble(comm, "test", ["x", str(RANK == 0)], False)


def test_selection_rule_under_mpirun():
    assert isinstance(select_communicator("auto"), MPICommunicator)  # Horovod on MPI, global set: mpi4py
    assert isinstance(select_communicator("horovod"), HorovodCommunicator)
    with pytest.raises(ValueError, match="transport must be one of"):
        select_communicator("nccl")
    with pytest.raises(ValueError, match="not both"):
        hgc.Compression.onebit(params(), communicator=MPICommunicator(), transport="horovod")


def test_node_discovery_through_the_mpi_transport():
    """The MPI transport names this rank's shared-memory node (one host here: every rank on
    node 0, local rank = rank), plain and polling alike, and the layout found from it covers
    every rank once."""
    from horovod_gradcomp.exchange.topology import discover_layout
    comm = MPICommunicator()
    assert comm.node_identity() == (0, RANK)
    assert comm.polling(1e-4).node_identity() == (0, RANK)
    layout = discover_layout(comm, None, "test")
    # one rank needs no collective to know its layout, so the source says so instead of "mpi"
    assert layout.source == ("mpi" if SIZE > 1 else "single rank")
    assert layout.nodes == (tuple(range(SIZE)),) and layout.rank == RANK
