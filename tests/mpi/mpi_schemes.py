"""Averaging and asynchronous schemes under mpirun (any -np, including 1).

Synchronous model averaging and EASGD are checked against float64 loops written here
(every rank simulates all K workers with hand-written gradients of a linear least-squares
model); the asynchronous schemes against the accounting invariant: final center ==
initial center + the sum of every push each worker recorded.
"""
from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from mpi4py import MPI

import horovod_gradcomp as hgc
from horovod_gradcomp.training.schemes.base import SchemeConfigError

COMM = MPI.COMM_WORLD
RANK, SIZE = COMM.Get_rank(), COMM.Get_size()
D_IN, D_OUT, BATCH, LR = 5, 3, 8, 0.05


def batch(worker: int, step: int):
    g = torch.Generator().manual_seed(1000 * worker + step)
    x = torch.randn(BATCH, D_IN, generator=g, dtype=torch.float64)
    y = torch.randn(BATCH, D_OUT, generator=g, dtype=torch.float64)
    return x, y


def initial_params(seed: int):
    torch.manual_seed(seed)
    return torch.nn.Linear(D_IN, D_OUT).double()


def train_loop(trainer, model, opt, steps: int, pause=None):
    for t in range(steps):
        x, y = batch(RANK, t)
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        trainer.step()
        if pause:
            pause(t)
    trainer.finish()


def oracle_grad(w, b, x, y):
    """Gradient of mean((x w^T + b - y)^2) by hand (float64)."""
    r = x @ w.T + b - y
    scale = 2.0 / r.numel()
    return scale * r.T @ x, scale * r.sum(0)


def oracle_local_step(w, b, worker, step):
    gw, gb = oracle_grad(w, b, *batch(worker, step))
    return w - LR * gw, b - LR * gb


def rank0_start(seed: int):
    """Rank 0's starting parameters (the model rank 0 built with ``seed``)."""
    m = initial_params(seed)
    return m.weight.detach().clone(), m.bias.detach().clone()


def allgather_flat(t: torch.Tensor) -> torch.Tensor:
    every = COMM.allgather(t.detach().numpy().copy())
    return torch.from_numpy(np.stack(every))


def assert_same_everywhere(model):
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = allgather_flat(flat)
    for r in range(SIZE):
        assert torch.equal(every[r], every[0]), f"rank {r} ends with other parameters than rank 0"


def _elastic_pull(ws, bs, cw, cb, dws, dbs, alpha):
    """The elastic oracle's exchange: each worker's (w, b) moves ``alpha`` times its difference
    (dws, dbs) back, the center (cw, cb) ``alpha`` times their sum forward; the new ws, bs, cw, cb."""
    return ([w - alpha * d for w, d in zip(ws, dws)], [b - alpha * d for b, d in zip(bs, dbs)],
            cw + alpha * sum(dws), cb + alpha * sum(dbs))


# -- synchronous ---------------------------------------------------------------------------
@pytest.mark.parametrize("period,steps", [(1, 3), (3, 10), (4, 8)])
def test_model_averaging_matches_float64_loop(period, steps):
    model = initial_params(seed=RANK + 7)  # rank 0's start must win (broadcast)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trainer = hgc.ModelAveraging(model, opt, period=period)
    train_loop(trainer, model, opt, steps)
    w0, b0 = rank0_start(7)
    ws, bs = [w0.clone() for _ in range(SIZE)], [b0.clone() for _ in range(SIZE)]
    for t in range(steps):
        for k in range(SIZE):
            ws[k], bs[k] = oracle_local_step(ws[k], bs[k], k, t)
        if (t + 1) % period == 0 or t == steps - 1:
            w_avg, b_avg = sum(ws) / SIZE, sum(bs) / SIZE
            ws, bs = [w_avg.clone() for _ in range(SIZE)], [b_avg.clone() for _ in range(SIZE)]
    torch.testing.assert_close(model.weight.detach(), ws[0], rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(model.bias.detach(), bs[0], rtol=1e-12, atol=1e-13)
    assert_same_everywhere(model)
    s = trainer.stats()
    assert s["exchanges"] == -(-steps // period) and s["local_steps"] == steps


@pytest.mark.parametrize("period,alpha,steps", [(1, 0.2, 4), (2, 0.15, 9), (3, 0.25, 7)])
def test_easgd_sync_matches_float64_loop(period, alpha, steps):
    model = initial_params(seed=RANK + 11)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trainer = hgc.EASGD(model, opt, period=period, alpha=alpha)
    train_loop(trainer, model, opt, steps)
    w0, b0 = rank0_start(11)
    ws, bs = [w0.clone() for _ in range(SIZE)], [b0.clone() for _ in range(SIZE)]
    cw, cb = w0.clone(), b0.clone()
    for t in range(steps):
        for k in range(SIZE):
            ws[k], bs[k] = oracle_local_step(ws[k], bs[k], k, t)
        if (t + 1) % period == 0:
            ws, bs, cw, cb = _elastic_pull(ws, bs, cw, cb, [w - cw for w in ws], [b - cb for b in bs], alpha)
    torch.testing.assert_close(model.weight.detach(), cw, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(model.bias.detach(), cb, rtol=1e-12, atol=1e-13)
    assert_same_everywhere(model)


def test_bad_options_raise_on_every_rank():
    model = initial_params(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(ValueError, match="period"):
        hgc.ModelAveraging(model, opt, period=0)
    with pytest.raises(ValueError, match="alpha"):
        hgc.EASGD(model, opt, alpha=1.5)
    with pytest.raises(ValueError, match="window"):
        hgc.ADAG(model, opt, window=0)


@pytest.mark.skipif(SIZE < 2, reason="a disagreement needs two ranks")
def test_ranks_disagreeing_on_the_period_fail_everywhere():
    model = initial_params(0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    with pytest.raises(SchemeConfigError, match="disagree"):
        hgc.ModelAveraging(model, opt, period=2 + (RANK == SIZE - 1))


# -- asynchronous --------------------------------------------------------------------------
def make_async(kind: str, model, opt, **extra):
    if kind == "easgd":
        return hgc.EASGD(model, opt, period=2, alpha=0.3, asynchronous=True, track_pushes=True, **extra)
    if kind == "downpour":
        return hgc.Downpour(model, opt, push_every=2, fetch_every=4, track_pushes=True, **extra)
    return hgc.ADAG(model, opt, window=3, track_pushes=True, **extra)


@pytest.mark.parametrize("codec", [None, "onebit"])
@pytest.mark.parametrize("kind", ["easgd", "downpour", "adag"])
def test_async_center_accounting(kind, codec):
    """Final center == initial center + every push each worker recorded (float64)."""
    steps = 11
    model = initial_params(seed=RANK + 3)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.5)
    trainer = make_async(kind, model, opt, codec=codec)
    start = trainer.get_flat().clone()
    # Uneven pace so pushes interleave differently on each rank.
    train_loop(trainer, model, opt, steps, pause=lambda t: time.sleep(0.002 * ((RANK + t) % 3)))
    final = trainer.get_flat()
    pushed = allgather_flat(trainer.pushed_sum).sum(0)
    torch.testing.assert_close(final, start + pushed, rtol=1e-12, atol=1e-12)
    assert_same_everywhere(model)
    s = trainer.stats()
    every = COMM.allgather(s)
    assert sum(e["pushes"] for e in every) == sum(e["center_updates"] for e in every) // SIZE
    assert sum(s["staleness_histogram"].values()) == s["pushes"]
    assert s["bytes_sent"] > 0 and s["bytes_received"] > 0
    if codec is None:  # the pushes moved the center
        assert pushed.abs().sum() > 0


def test_async_schemes_need_every_rank_to_finish_and_step_after_finish_fails():
    model = initial_params(1)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    trainer = hgc.ADAG(model, opt, window=2)
    trainer.finish()
    trainer.finish()  # idempotent
    with pytest.raises(RuntimeError, match="after finish"):
        trainer.step()


def test_sync_state_dict_round_trip_continues_identically():
    def run(split):
        model = initial_params(0)
        opt = torch.optim.SGD(model.parameters(), lr=LR)
        trainer = hgc.EASGD(model, opt, period=2, alpha=0.2)
        for t in range(7):
            if t == split:
                state = trainer.state_dict()
                model2 = initial_params(5)
                opt = torch.optim.SGD(model2.parameters(), lr=LR)
                trainer = hgc.EASGD(model2, opt, period=2, alpha=0.2)  # broadcasts rank 0's start...
                model2.load_state_dict(model.state_dict())  # ...so each rank's own model is loaded after it
                trainer.load_state_dict(state)
                model = model2
            x, y = batch(RANK, t)
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            trainer.step()
        trainer.finish()
        return trainer.get_flat()
    torch.testing.assert_close(run(split=3), run(split=-1), rtol=0, atol=0)


# -- synchronous schemes through a codec (onebit with error feedback) ------------------------
def onebit_with_feedback(codec, residuals, key, v):
    """(decoded, new residual) of ``v + residual`` through the codec (error feedback by hand)."""
    comp = v + residuals.get(key, torch.zeros_like(v))
    decoded = codec.decode(codec.encode(comp.clone()))
    residuals[key] = comp - decoded
    return decoded


@pytest.mark.parametrize("kind", ["model_averaging", "easgd"])
def test_sync_schemes_with_onebit_match_float64_loop(kind):
    period, alpha, steps = 2, 0.2, 7
    codec = hgc.get_codec("onebit", impl="reference")
    model = initial_params(seed=RANK + 21)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    if kind == "model_averaging":
        trainer = hgc.ModelAveraging(model, opt, period=period, codec=codec)
    else:
        trainer = hgc.EASGD(model, opt, period=period, alpha=alpha, codec=codec)
    train_loop(trainer, model, opt, steps)
    w0, b0 = rank0_start(21)
    ws, bs = [w0.clone() for _ in range(SIZE)], [b0.clone() for _ in range(SIZE)]
    aw, ab = w0.clone(), b0.clone()  # the anchor (averaging) or the center (EASGD)
    res = [dict() for _ in range(SIZE)]
    for t in range(steps):
        for k in range(SIZE):
            ws[k], bs[k] = oracle_local_step(ws[k], bs[k], k, t)
        due = (t + 1) % period == 0 or (kind == "model_averaging" and t == steps - 1)
        if not due:
            continue
        dw = [onebit_with_feedback(codec, res[k], "w", ws[k] - aw) for k in range(SIZE)]
        db = [onebit_with_feedback(codec, res[k], "b", bs[k] - ab) for k in range(SIZE)]
        if kind == "model_averaging":
            aw, ab = aw + sum(dw) / SIZE, ab + sum(db) / SIZE
            ws, bs = [aw.clone() for _ in range(SIZE)], [ab.clone() for _ in range(SIZE)]
        else:
            ws, bs, aw, ab = _elastic_pull(ws, bs, aw, ab, dw, db, alpha)
    torch.testing.assert_close(model.weight.detach(), aw, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(model.bias.detach(), ab, rtol=1e-9, atol=1e-10)
    assert_same_everywhere(model)
    s = trainer.stats()
    dense = (SIZE - 1) * 2 * (D_IN * D_OUT + D_OUT) * 8 * s["exchanges"]
    if SIZE > 1:
        assert 0 < s["bytes_sent"] < dense  # encoded: fewer bytes than dense float64 (headers included)
