"""Buckets, the communication thread and the two-phase pattern through stock Horovod.

Every codec encodes each tensor from its own stream position and decodes it on its own, so
how tensors are grouped into buckets, and whether buckets leave during backward, must not
change a single bit of the result. The hook order also differs between ranks here (the
branches run in another order on odd ranks) and one parameter gets no gradient on some
ranks and steps (Horovod then submits zeros at synchronize), which sends every bucket
through the flush path at least once.
"""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.two_phase import TwoPhasePattern
from horovod_gradcomp.hvd_adapter.adam_defaults import apply_optimizer_defaults

from .mpi_helpers import (LocalGradients, assert_identical_across_ranks, fresh_state, init, needs_peers,
                          onebit_unramped, two_phase_exchange)

RANK, SIZE = init()
STEPS = 5


class Branches(torch.nn.Module):
    """Tensors from 1 to 2,400 values; hooks fire in a rank-dependent order."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(24, 100)
        self.b = torch.nn.Linear(24, 100)
        self.c = torch.nn.Linear(100, 3)
        self.rare = torch.nn.Linear(24, 100, bias=False)

    def forward(self, x, use_rare):
        first, second = (self.a, self.b) if RANK % 2 == 0 else (self.b, self.a)
        h = torch.tanh(first(x)) + torch.tanh(second(x))
        if use_rare:
            h = h + self.rare(x)
        return self.c(h)


def train(factory, steps=STEPS):
    """Parameters after each step and the compression, for ``factory(named_parameters)``."""
    model = Branches()
    comp = factory(list(model.named_parameters()))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    history = []
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x = torch.randn(8, 24, generator=g)
        opt.zero_grad()
        model(x, use_rare=(step % 2 == 0 and RANK == 0)).pow(2).mean().backward()
        opt.step()
        history.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert_identical_across_ranks(model)
    return history, comp


CODECS = {
    "onebit": onebit_unramped,
    "terngrad": lambda named, **kw: hgc.Compression.terngrad(named, **kw),
    "qsgd": lambda named, **kw: hgc.Compression.qsgd(named, bits=4, bucket=64, **kw),
    "dgc": lambda named, **kw: hgc.Compression.dgc(named, density=0.05, **kw),
}
PATTERNS = {"onebit": ["allgather", "two_phase"], "terngrad": ["allgather", "two_phase"],
            "qsgd": ["two_phase"], "dgc": ["allgather"]}
CASES = [(c, p) for c in CODECS for p in PATTERNS[c]]


@needs_peers
@pytest.mark.parametrize("codec, pattern", CASES)
def test_buckets_and_overlap_change_nothing(codec, pattern):
    make = CODECS[codec]
    baseline, _ = train(lambda named: make(named, pattern=pattern))
    # 64 bytes: every tensor is a bucket of its own (buckets smaller than a tensor);
    # 5000 bytes: several tensors per bucket; 1 GB: one bucket.
    for bucket_bytes in (64, 5000, 1 << 30):
        for overlap in (True, False):
            history, comp = train(lambda named: make(named, pattern=pattern, bucket_bytes=bucket_bytes,
                                                     overlap=overlap))
            for step, (got, want) in enumerate(zip(history, baseline)):
                assert torch.equal(got, want), f"{codec}/{pattern} bucket_bytes={bucket_bytes} overlap={overlap} " \
                                               f"step {step}: differs from the unbucketed exchange"
            assert comp.engine.plan is not None and (len(comp.engine.plan) > 1) == (bucket_bytes < 1 << 30)


@needs_peers
@pytest.mark.parametrize("codec, pattern", [c for c in CASES if c[0] != "dgc"] + [("qsgd", "allgather")])
def test_pipelined_chunks_change_nothing(codec, pattern):
    """A bucket sent as pipelined chunks (each chunk's collectives on the wire thread) gives the
    same bits as the bucket at once, with and without buckets and overlap, and the same bytes
    but for each chunk's padding to 8 bytes."""
    make = CODECS[codec]
    for pipeline_bytes, bucket_bytes in ((1, None), (300, None), (300, 5000), (1, 64)):
        baseline, base_comp = train(lambda named: make(named, pattern=pattern, pipeline_bytes=None,
                                                       bucket_bytes=bucket_bytes))
        history, comp = train(lambda named: make(named, pattern=pattern, pipeline_bytes=pipeline_bytes,
                                                 bucket_bytes=bucket_bytes))
        for step, (got, want) in enumerate(zip(history, baseline)):
            assert torch.equal(got, want), f"{codec} pipeline_bytes={pipeline_bytes} bucket_bytes={bucket_bytes} " \
                                           f"step {step}: differs from one allgather per bucket"
        got, want = comp.stats(), base_comp.stats()
        assert got["tensors"] == want["tensors"]
        # at most 7 bytes per fused layout (1 per chunk for the allgather, K for two-phase), at most
        # one chunk per tensor
        padding = 8 * got["tensors"]
        assert 0 <= got["bytes_payload"] - want["bytes_payload"] < SIZE * padding
        assert 0 <= got["bytes_sent"] - want["bytes_sent"] < 2 * SIZE * padding
        assert comp.engine.driver.wire.started, "the bucket was not pipelined"
        assert not base_comp.engine.driver.wire.started


@needs_peers
def test_pipelined_chunks_with_blocking_wire_collectives(monkeypatch):
    """HOROVOD_GRADCOMP_WIRE_POLL_S=0: the wire thread's collectives block instead of polling;
    same bits."""
    make = CODECS["onebit"]
    baseline, _ = train(lambda named: make(named, pipeline_bytes=None))
    monkeypatch.setenv("HOROVOD_GRADCOMP_WIRE_POLL_S", "0")
    history, comp = train(lambda named: make(named, pipeline_bytes=1))
    assert all(torch.equal(g, w) for g, w in zip(history, baseline))
    assert comp.engine.driver.wire.started


def test_bad_pipeline_bytes_is_a_clear_error():
    named = list(Branches().named_parameters())
    for bad in (-1, 1.5, "big", True):
        with pytest.raises(ValueError, match="pipeline_bytes"):
            hgc.Compression.onebit(named, pipeline_bytes=bad)


@needs_peers
@pytest.mark.parametrize("codec", ["onebit", "terngrad"])
def test_two_phase_through_horovod_is_the_engine(codec):
    """The adapter's two-phase grads equal the engine's on the same local gradients (the
    engine itself is checked against an independent computation in mpi_two_phase.py)."""
    model = Branches()
    named = list(model.named_parameters())
    comp = CODECS[codec](named, pattern="two_phase")
    # the engine's codec with the options the adapter takes from the SGD it learns at the first
    # compress (TernGrad's sgd_defaults: clip at 2.5 sigma)
    engine = TwoPhasePattern(CODECS[codec](named, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).codec)
    state = fresh_state(comp.memory.enabled)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    order = {n: i for i, n in enumerate(sorted(n for n, _ in named))}
    grads = LocalGradients(named)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 24, generator=torch.Generator().manual_seed(step + 10 * RANK)), False).sum().backward()
        # rare gets no gradient: Horovod submits zeros for it at synchronize
        local = grads.take()
        opt.synchronize()
        names = sorted(local, key=order.__getitem__)
        state.step = step
        expected, _ = two_phase_exchange(engine, names, local, state, order)
        for n, p in named:
            assert torch.equal(p.grad, expected[n]), f"{codec} step {step} {n}"
        with opt.skip_synchronize():
            opt.step()


@needs_peers
def test_two_phase_sends_about_two_payloads_per_rank():
    _, two = train(lambda named: hgc.Compression.onebit(named, pattern="two_phase"), steps=2)
    _, gather = train(lambda named: hgc.Compression.onebit(named, pattern="allgather"), steps=2)
    s_two, s_gather = two.stats(), gather.stats()
    payload = s_gather["bytes_payload"] / s_gather["steps"]
    assert s_two["bytes_sent_per_step"] <= 2.6 * payload  # about 2(K-1)/K payloads, plus checks
    assert s_gather["bytes_sent_per_step"] >= (SIZE - 1) * payload


def test_bad_pattern_options_are_clear_errors():
    named = list(Branches().named_parameters())
    with pytest.raises(ValueError, match="pattern must be one of"):
        hgc.Compression.onebit(named, pattern="ring")
    with pytest.raises(ValueError, match="variable-size"):
        hgc.Compression.dgc(named, pattern="two_phase")
    with pytest.raises(ValueError, match="bucket_bytes"):
        hgc.Compression.onebit(named, bucket_bytes=0)


@needs_peers
@pytest.mark.parametrize("kind", ["onebit", "terngrad", "none"])
def test_exchange_without_hooks_equals_the_hook_path(kind):
    """``compression.exchange(grads)`` (used by the pipeline) gives what the hooks give."""
    make = {"none": lambda named: hgc.Compression.none(named), **CODECS}[kind]
    model = Branches()
    named = list(model.named_parameters())
    hooked, direct = make(named), make(named)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=hooked)
    if kind != "none":   # the SGD defaults the hooked one takes at its first compress
        apply_optimizer_defaults(direct, opt)
    for step in range(3):
        opt.zero_grad()
        loss = model(torch.randn(8, 24, generator=torch.Generator().manual_seed(step + 10 * RANK)), True).sum()
        # autograd.grad fires no hooks; Horovod's dense allreduce works in place on p.grad
        local = dict(zip([n for n, _ in named], torch.autograd.grad(loss, [p for _, p in named], retain_graph=True)))
        loss.backward()
        opt.synchronize()
        got = direct.exchange(local)
        for n, p in named:
            if kind == "none":  # Horovod may fuse and divide in another order: float32 rounding,
                # after cancellation a few ulps of the summands
                torch.testing.assert_close(got[n], p.grad, rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(got[n], p.grad), f"{kind} step {step} {n}"
        with opt.skip_synchronize():
            opt.step()
