"""DoubleBufferedStep under mpirun (-np 1, 2, 3, 4): the parameters after every call equal
an independently written delayed-update recurrence.

The reference below shares nothing with the pipeline: its own forward pass of the MLP
(matmuls by hand), every rank's half-batch gradients recomputed locally from the data
seeds (no communication), its own SGD-with-momentum and AdaGrad updates, and for onebit
every rank's error-feedback residual kept by hand with the pure-torch reference codec.
Schedule checked (halves h = 0, 1, ...; minibatch t holds halves 2t and 2t+1):
``G_h = 1/2 * mean_k grad(w_{max(h-1, 0)}; half h of rank k)`` and
``w_{h+1} = update(w_h, G_h)``; after call t the model holds ``w_{2t+1}``, after the
flush ``w_{2M}``.
"""
from __future__ import annotations

import math

import horovod.torch as hvd
import pytest
import torch
import torch.nn.functional as F

import horovod_gradcomp as hgc
from horovod_gradcomp.transports.mpi import MPICommunicator
from horovod_gradcomp.transports.mpi_polling import PollingCommunicator

from .mpi_helpers import assert_identical_across_ranks, init, onebit_unramped

RANK, SIZE = init()
DT = torch.float64
N = 8          # samples per rank and minibatch
STEPS = 4      # minibatches
LR, MOMENTUM = 0.1, 0.9


def make_model():
    torch.manual_seed(0)  # the same initial parameters on every rank
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3)).to(DT)


def data(t, k):
    """Rank k's minibatch t: (x float64[N, 5], y int64[N])."""
    g = torch.Generator().manual_seed(7919 * t + k + 1)
    return torch.randn(N, 5, generator=g, dtype=DT), torch.randint(0, 3, (N,), generator=g)


def loss_fn_of(model):
    return lambda x, y: F.cross_entropy(model(x), y)


# -- the reference ------------------------------------------------------------------------

def ref_grad(w, x, y):
    """Gradient of the mean cross-entropy of the MLP written out by hand."""
    leaves = {n: v.clone().requires_grad_(True) for n, v in w.items()}
    h = torch.tanh(x @ leaves["0.weight"].T + leaves["0.bias"])
    logits = h @ leaves["2.weight"].T + leaves["2.bias"]
    loss = (torch.logsumexp(logits, 1) - logits.gather(1, y[:, None])[:, 0]).mean()
    loss.backward()
    return {n: v.grad for n, v in leaves.items()}


class RefSGD:
    def __init__(self):
        self.buf = None

    def __call__(self, w, g):
        self.buf = dict(g) if self.buf is None else {n: MOMENTUM * self.buf[n] + g[n] for n in g}
        return {n: w[n] - LR * self.buf[n] for n in w}


class RefAdagrad:
    def __init__(self):
        self.sum = None

    def __call__(self, w, g):
        self.sum = {n: (0 if self.sum is None else self.sum[n]) + g[n] * g[n] for n in g}
        return {n: w[n] - LR * g[n] / (self.sum[n].sqrt() + 1e-10) for n in w}


class RefOnebit:
    """mean_k decode(encode(g_k + r_k)) with every rank's residual r_k kept here."""

    def __init__(self):
        self.codec = hgc.get_codec("onebit", impl="reference")
        self.res = [{} for _ in range(SIZE)]

    def mean(self, grads_per_rank):
        out = {}
        for n in grads_per_rank[0]:
            decoded = []
            for k, g in enumerate(grads_per_rank):
                v = g[n] + self.res[k].get(n, torch.zeros_like(g[n]))
                q = self.codec.decode(self.codec.encode(v.clone()))
                self.res[k][n] = v - q
                decoded.append(q)
            out[n] = sum(decoded) / SIZE
        return out


def exact_mean(grads_per_rank):
    return {n: sum(g[n] for g in grads_per_rank) / SIZE for n in grads_per_rank[0]}


def reference(w0, update, mean=exact_mean, double_buffering=True):
    """[w_0, w_1, ...]: the parameters after each update (2 * STEPS updates with double
    buffering, STEPS without)."""
    ws = [w0]
    if not double_buffering:
        for t in range(STEPS):
            g = mean([ref_grad(ws[-1], *data(t, k)) for k in range(SIZE)])
            ws.append(update(ws[-1], g))
        return ws
    for h in range(2 * STEPS):
        t, lo = h // 2, (h % 2) * (N // 2)
        at = ws[max(h - 1, 0)]  # one half late
        per_rank = []
        for k in range(SIZE):
            x, y = data(t, k)
            per_rank.append(ref_grad(at, x[lo:lo + N // 2], y[lo:lo + N // 2]))
        g = {n: 0.5 * v for n, v in mean(per_rank).items()}
        ws.append(update(ws[-1], g))
    return ws


# -- the pipeline -------------------------------------------------------------------------

def run_pipeline(make_opt, make_comp, double_buffering=True, overlap=True):
    """[params after call 0, ..., after call STEPS-1, after the flush] (dicts of clones)."""
    model = make_model()
    step = hgc.DoubleBufferedStep(model.named_parameters(), make_opt(model.parameters()), make_comp(model),
                                  double_buffering=double_buffering, overlap=overlap)
    seen = []
    for t in range(STEPS):
        step.step(loss_fn_of(model), data(t, RANK))
        seen.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert step.flush() == (1 if double_buffering else 0)
    step.close()
    seen.append({n: p.detach().clone() for n, p in model.named_parameters()})
    assert_identical_across_ranks(model)
    return seen


def check_against(seen, ws, rtol, atol, double_buffering=True):
    expect = [ws[2 * t + 1] for t in range(STEPS)] + [ws[-1]] if double_buffering else ws[1:] + [ws[-1]]
    for i, (got, want) in enumerate(zip(seen, expect)):
        for n in want:
            torch.testing.assert_close(got[n], want[n], rtol=rtol, atol=atol, msg=lambda m: f"call {i} {n}: {m}")


def initial():
    return {n: p.detach().clone() for n, p in make_model().named_parameters()}


OPTIMIZERS = {
    "sgd": (lambda ps: torch.optim.SGD(ps, lr=LR, momentum=MOMENTUM), RefSGD),
    "adagrad": (lambda ps: torch.optim.Adagrad(ps, lr=LR), RefAdagrad),
}


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("overlap", [True, False])
def test_none_matches_delayed_reference(opt, overlap):
    make_opt, ref_opt = OPTIMIZERS[opt]
    seen = run_pipeline(make_opt, lambda m: hgc.Compression.none(), overlap=overlap)
    check_against(seen, reference(initial(), ref_opt()), rtol=1e-12, atol=1e-13)


def test_overlap_does_not_change_the_parameters():
    make_opt = OPTIMIZERS["sgd"][0]
    a = run_pipeline(make_opt, lambda m: hgc.Compression.none(), overlap=True)
    b = run_pipeline(make_opt, lambda m: hgc.Compression.none(), overlap=False)
    for x, y in zip(a, b):
        assert all(torch.equal(x[n], y[n]) for n in x)


def test_the_delay_is_real():
    """The pipeline's result differs from the same halves applied without delay."""
    seen = run_pipeline(OPTIMIZERS["sgd"][0], lambda m: hgc.Compression.none())
    undelayed = [initial()]
    update = RefSGD()
    for h in range(2 * STEPS):
        t, lo = h // 2, (h % 2) * (N // 2)
        per_rank = [ref_grad(undelayed[-1], data(t, k)[0][lo:lo + N // 2], data(t, k)[1][lo:lo + N // 2])
                    for k in range(SIZE)]
        undelayed.append(update(undelayed[-1], {n: 0.5 * v for n, v in exact_mean(per_rank).items()}))
    gap = max((seen[-1][n] - undelayed[-1][n]).abs().max().item() for n in undelayed[-1])
    assert gap > 1e-6


def test_off_is_the_synchronous_step():
    seen = run_pipeline(OPTIMIZERS["sgd"][0], lambda m: hgc.Compression.none(), double_buffering=False)
    check_against(seen, reference(initial(), RefSGD(), double_buffering=False), rtol=1e-12, atol=1e-13,
                  double_buffering=False)


@pytest.mark.parametrize("polling", [False, True])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_onebit_matches_delayed_reference_with_reference_decode(opt, polling):
    make_opt, ref_opt = OPTIMIZERS[opt]
    comm = PollingCommunicator() if polling else None
    seen = run_pipeline(make_opt, lambda m: onebit_unramped(m.named_parameters(), communicator=comm))
    # observed: equal to float64 rounding; the margin allows a float32 scale to round differently
    check_against(seen, reference(initial(), ref_opt(), mean=RefOnebit().mean), rtol=1e-9, atol=1e-12)


def test_same_number_of_updates_on_every_rank():
    model = make_model()
    step = hgc.DoubleBufferedStep(model.named_parameters(), torch.optim.SGD(model.parameters(), lr=LR),
                                  onebit_unramped(model.named_parameters()), double_buffering=True)
    for t in range(3):
        step.step(loss_fn_of(model), data(t, RANK))
        assert step.pending and step.updates == 2 * t + 1
    step.close()
    counts = hvd.allgather(torch.tensor([[step.updates, step.halves]]))
    assert counts.tolist() == [[6, 6]] * SIZE
    assert math.isfinite(step.stats()["exchange_s"])


def test_polling_communicator_moves_the_same_bytes():
    import numpy as np

    polling, blocking = PollingCommunicator(interval_s=1e-4), MPICommunicator()
    assert (polling.rank, polling.size) == (RANK, SIZE)
    mine = torch.arange(5 + RANK, dtype=torch.uint8) + RANK
    assert all(torch.equal(a, b) for a, b in zip(polling.allgatherv(mine), blocking.allgatherv(mine)))
    fixed = torch.full((4,), RANK, dtype=torch.uint8)
    assert torch.equal(polling.allgather(fixed), blocking.allgather(fixed))
    counts = [2] * SIZE
    send = torch.arange(2 * SIZE, dtype=torch.uint8) + 10 * RANK
    assert torch.equal(polling.alltoallv(send, counts, counts), blocking.alltoallv(send, counts, counts))
    vals = np.array([RANK, -RANK], dtype=np.float64)
    assert np.array_equal(polling.allreduce_max(vals), blocking.allreduce_max(vals))
    from horovod_gradcomp.exchange.blocking_driver import BlockingDriver
    from horovod_gradcomp.exchange.preamble import preamble_steps
    from horovod_gradcomp.exchange.stats import ExchangeStats
    assert BlockingDriver(ExchangeStats()).run(preamble_steps(polling, "test", ["same"], RANK == 0)) is True
    with pytest.raises(ValueError):
        PollingCommunicator(interval_s=0)
