"""The device exchange's CPU twin under mpirun (-np 1, 2, 3, 4): staging and stream hand-overs.

Every pack and unpack of a CPU exchange goes through the direct staging on the CPU
(exchange/staging.py: what a CUDA-aware MPI gets on a GPU, without the event): its counters must
grow and it must make no copy, for the fixed and variable allgathers, the two-phase exchange and
their pipelined chunks. With the pipeline, each chunk's collective is handed to the wire thread
and its result back (``wire-send`` / ``wire-recv``); with a bucket plan and overlap, gradients go
to the engine's ``hgc-exchange`` thread (``grad``) and results come back (``result``): each must
be recorded by the producing thread and waited by the consuming one. Results are checked equal
on every rank and equal to the same exchange without pipeline or overlap.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange import staging

from .mpi_helpers import gather_tensors, init

RANK, SIZE = init()
SHAPES = {"a": (64, 40), "b": (300,), "c": (16, 3, 3, 3), "d": (1,)}
CASES = {  # id: (codec, options)
    "onebit-allgather": ("onebit", {"pattern": "allgather"}),
    "onebit-two_phase": ("onebit", {"pattern": "two_phase"}),
    "terngrad-two_phase": ("terngrad", {"pattern": "two_phase", "seed": 3}),
    "qsgd-elias": ("qsgd", {"coding": "elias", "seed": 1}),
}


def named():
    return [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in SHAPES.items()]


def grads(step):
    gen = torch.Generator().manual_seed(100 * step + RANK)
    return {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}


def assert_same_on_every_rank(out):
    for n, r in out.items():
        every = gather_tensors(r)
        assert all(torch.equal(every[k], every[0]) for k in range(SIZE)), f"{n} differs between ranks"


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", list(CASES))
def test_exchange_goes_through_the_direct_staging_without_copies(case):
    codec, opts = CASES[case]
    host = staging.staging_for("cpu")
    chunked = hgc.Compression.codec(codec, named(), pipeline_bytes=64, **opts)
    whole = hgc.Compression.codec(codec, named(), pipeline_bytes=None, **opts)
    for step in range(2):
        before = host.counters()
        out = chunked.exchange(grads(step))
        after = host.counters()
        assert after["gathers"] > before["gathers"] and after["scatters"] > before["scatters"]
        assert after["copies"] == 0 and after["waits"] == 0
        want = whole.exchange(grads(step))
        for n in SHAPES:
            assert torch.equal(out[n], want[n]), f"{case} step {step} {n}: chunks change the result"
        assert_same_on_every_rank(out)
    wire = chunked.engine.driver.wire.handoff
    if SIZE > 1 and codec != "qsgd":   # pipelined chunks: fixed-size payloads, K > 1
        assert wire.records["wire-send"] == wire.waits["wire-send"] > 0
        assert all(t.startswith("hgc-wire") for t in wire.seen("wait", "wire-send"))
        assert all(t.startswith("hgc-wire") for t in wire.seen("record", "wire-recv"))
        assert wire.waits["wire-recv"] == wire.records["wire-recv"]
        assert not any(t.startswith("hgc-wire") for t in wire.seen("wait", "wire-recv"))
    else:
        assert wire.records["wire-send"] == 0


@pytest.mark.timeout(240)
def test_overlapped_buckets_hand_gradients_and_results_between_threads():
    comp = hgc.Compression.onebit(named(), bucket_bytes=4096, overlap=True)
    plain = hgc.Compression.onebit(named(), bucket_bytes=4096, overlap=False)
    engine, h = comp.engine, comp.engine.handoff
    for step in range(3):
        g = grads(step)
        for n in reversed(list(SHAPES)):
            engine.submit(n, g[n])
        out = engine.finish()
        want = plain.engine.exchange(grads(step))
        for n in SHAPES:
            assert torch.equal(out[n], want[n]), f"step {step} {n}"
        assert_same_on_every_rank(out)
    main = h.seen("record", "grad")[0]
    assert h.records["grad"] == h.waits["grad"] == 3 * len(SHAPES)
    assert set(h.seen("record", "grad")) == {main}
    assert "hgc-exchange" in h.seen("wait", "grad")
    assert "hgc-exchange" in h.seen("record", "result")
    assert set(h.seen("wait", "result")) == {main}
