"""hgc.OnebitAdam / OnebitAdamW under mpirun: against a pure-torch reference of all K ranks
(every rank's gradient gathered through Horovod, the onebit reference codec with one residual per
simulated rank), parameters bitwise equal on every rank, a per-rank checkpoint resumes bitwise,
and wrapping it in hvd.DistributedOptimizer is refused on every rank.
"""
from __future__ import annotations

import io

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc

from .mpi_helpers import assert_identical_across_ranks, gather_tensors, init, init_gloo

RANK, SIZE = init()
STEPS, WARMUP, LR = 10, 3, 1e-2


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _backward(model, step, rank=RANK):
    """This rank's gradient at ``step``: its own batch."""
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _reference_step(ref, state, t, wd, decoupled, b1=0.9, b2=0.999, eps=1e-8):
    """One step of the module's math over all K ranks: ``ref`` holds the (shared) parameters;
    the gradients of every rank are gathered from the real run's ranks."""
    codec = hgc.get_codec("onebit", impl="reference", scales="rows")
    _backward(ref, t)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            every = gather_tensors(p.grad)   # [K, ...]: every rank's gradient at the same parameters
            st = state.setdefault(n, {"m": torch.zeros_like(p), "v": torch.zeros_like(p),
                                      "r": [torch.zeros_like(p) for _ in range(SIZE)]})
            if t <= WARMUP:
                g = every.to(torch.float64).mean(0).to(p.dtype)
                if wd and not decoupled:
                    g = g + wd * p
                st["m"] = b1 * st["m"] + (1 - b1) * g
                st["v"] = b2 * st["v"] + (1 - b2) * g * g
            else:
                local = []
                for k in range(SIZE):
                    g = every[k] + wd * p if wd and not decoupled else every[k]
                    local.append(codec.decode(codec.encode(b1 * st["m"] + (1 - b1) * g, residual=st["r"][k])))
                st["m"] = torch.stack(local).to(torch.float64).mean(0).to(p.dtype)
            if decoupled and wd:
                p.mul_(1 - LR * wd)
            v_hat = st["v"] / (1 - b2 ** min(t, WARMUP))
            p.sub_(LR * (st["m"] / (1 - b1 ** t)) / (v_hat.sqrt() + eps))


@pytest.mark.parametrize("decoupled,wd", [(False, 0.01), (True, 0.05)])
def test_matches_the_reference_of_all_ranks(decoupled, wd):
    model, ref = _model(), _model()
    opt = (hgc.OnebitAdamW if decoupled else hgc.OnebitAdam)(model.named_parameters(), lr=LR, weight_decay=wd,
                                                             warmup_steps=WARMUP)
    state = {}
    for t in range(1, STEPS + 1):
        _backward(model, t)
        opt.step()
        _reference_step(ref, state, t, wd, decoupled)
        for p, q in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=f"step {t}")
    assert_identical_across_ranks(model)
    stats = opt.stats()
    assert stats["steps"] == STEPS
    if SIZE > 1:   # the 1-bit steps send far less than the dense warm-up steps
        assert 0 < stats["bytes_sent_per_step"] < stats["bytes_dense_per_step"]


def test_checkpoint_per_rank_resumes_bitwise():
    def run(resume_at=None):
        model = _model()
        opt = hgc.OnebitAdam(model.named_parameters(), lr=LR, warmup_steps=WARMUP)
        for t in range(1, STEPS + 1):
            if t == resume_at:
                buf = io.BytesIO()
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, buf)
                buf.seek(0)
                saved = torch.load(buf, weights_only=True)
                model = _model()
                opt = hgc.OnebitAdam(model.named_parameters(), lr=LR, warmup_steps=WARMUP)
                model.load_state_dict(saved["model"])
                opt.load_state_dict(saved["opt"])
            _backward(model, t)
            opt.step()
        return model

    straight, resumed = run(), run(resume_at=WARMUP + 3)
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)
    assert_identical_across_ranks(resumed)


def test_wrapping_in_horovods_optimizer_is_refused_on_every_rank():
    model = _model()
    with pytest.raises(TypeError, match="do not wrap it in hvd.DistributedOptimizer"):
        hvd.DistributedOptimizer(hgc.OnebitAdam(model.named_parameters(), lr=LR),
                                 named_parameters=model.named_parameters())


def _init_torch_distributed():
    """torch.distributed on gloo over the mpirun ranks."""
    init_gloo("onebit_adam")


def test_ddp_pair_equals_the_mpi_path():
    """hgc.ddp.onebit_adam (local-gradient hook + OnebitAdamW on torch.distributed) steps the
    model as OnebitAdamW over mpi4py does from the same local gradients, on every rank."""
    _init_torch_distributed()
    ddp = torch.nn.parallel.DistributedDataParallel(_model(), bucket_cap_mb=0.0001)   # several buckets
    plain = _model()
    opt = hgc.ddp.onebit_adam(ddp, decoupled=True, lr=LR, weight_decay=0.05, warmup_steps=WARMUP)
    ref = hgc.OnebitAdamW(plain.named_parameters(), lr=LR, weight_decay=0.05, warmup_steps=WARMUP)
    assert isinstance(opt, hgc.OnebitAdamW)
    for t in range(1, STEPS + 1):
        _backward(ddp, t)
        _backward(plain, t)
        for p, q in zip(ddp.module.parameters(), plain.parameters()):   # the hook left the local gradient
            assert torch.equal(p.grad, q.grad), f"step {t}: DDP's hook changed the gradient"
        opt.step()
        ref.step()
        for p, q in zip(ddp.module.parameters(), plain.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=f"step {t}")
    assert_identical_across_ranks(ddp.module)
    assert opt.stats()["steps"] == STEPS


def test_ddp_pair_misuse_is_refused():
    _init_torch_distributed()
    with pytest.raises(TypeError, match="expects a DistributedDataParallel model"):
        hgc.ddp.onebit_adam(_model())
    ddp = torch.nn.parallel.DistributedDataParallel(_model())
    with pytest.raises(ValueError, match="transport= does not apply"):
        hgc.ddp.onebit_adam(ddp, transport="mpi")


def test_two_phase_pattern_keeps_ranks_identical():
    """pattern="two_phase" (owners requantize the mean with their own residuals): no reference
    here, but every rank holds bitwise the same parameters and the loss falls."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))
    opt = hgc.OnebitAdam(model.named_parameters(), lr=LR, warmup_steps=WARMUP, pattern="two_phase")
    losses = []
    for t in range(1, 4 * STEPS + 1):
        gen = torch.Generator().manual_seed(7)   # one fixed batch per rank: the loss must fall
        x = torch.randn(64, 6, generator=gen) + RANK
        y = (x[:, 0] > RANK).long()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(hvd.allreduce(loss.detach(), name="hgc.test.onebit_adam.loss")))
    assert_identical_across_ranks(model)
    assert losses[-1] < 0.7 * losses[0], losses
