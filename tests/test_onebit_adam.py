"""hgc.OnebitAdam / OnebitAdamW in one process (a world of one rank): the warm-up is torch's
Adam/AdamW, the compressed phase follows a pure-torch reference of its math (the onebit
reference codec with error feedback on the momentum, the variance frozen), misuse is refused,
and a checkpoint resumes bitwise. Under mpirun: tests/mpi/mpi_onebit_adam.py.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _grads(model, step):
    gen = torch.Generator().manual_seed(100 + step)
    x, y = torch.randn(16, 6, generator=gen), torch.randint(0, 3, (16,), generator=gen)
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()


def _reference(model, steps, warmup, lr, wd, decoupled, betas=(0.9, 0.999), eps=1e-8):
    """The module doc's math for one rank, in plain torch: torch's Adam(W) for ``warmup`` steps,
    then the momentum through the onebit reference codec with a residual, the variance frozen."""
    codec = hgc.get_codec("onebit", impl="reference", scales="rows")
    params = list(model.named_parameters())
    opt = (torch.optim.AdamW if decoupled else torch.optim.Adam)(model.parameters(), lr=lr, betas=betas, eps=eps,
                                                                 weight_decay=wd)
    residual = {n: torch.zeros_like(p) for n, p in params}
    b1, b2 = betas
    for t in range(1, steps + 1):
        _grads(model, t)
        if t <= warmup:
            opt.step()
            continue
        with torch.no_grad():
            for n, p in params:
                st = opt.state[p]
                g = p.grad if decoupled or not wd else p.grad + wd * p
                local = b1 * st["exp_avg"] + (1 - b1) * g
                st["exp_avg"] = codec.decode(codec.encode(local, residual=residual[n]))
                if decoupled and wd:
                    p.mul_(1 - lr * wd)
                v_hat = st["exp_avg_sq"] / (1 - b2 ** warmup)
                p.sub_(lr * (st["exp_avg"] / (1 - b1 ** t)) / (v_hat.sqrt() + eps))
    return model


@pytest.mark.parametrize("decoupled,wd", [(False, 0.0), (False, 0.01), (True, 0.05)])
def test_matches_the_reference(decoupled, wd):
    steps, warmup, lr = 12, 4, 1e-2
    ref = _reference(_model(), steps, warmup, lr, wd, decoupled)
    model = _model()
    cls = hgc.OnebitAdamW if decoupled else hgc.OnebitAdam
    opt = cls(model.named_parameters(), lr=lr, weight_decay=wd, warmup_steps=warmup)
    for t in range(1, steps + 1):
        _grads(model, t)
        opt.step()
        if t == warmup:   # the warm-up alone is torch's optimizer
            check = _reference(_model(), warmup, warmup, lr, wd, decoupled)
            for p, q in zip(model.parameters(), check.parameters()):
                torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    # bytes: W dense steps, then one onebit payload per step
    stats = opt.stats()
    assert stats["steps"] == steps and stats["bytes_sent_per_step"] >= 0
    assert opt.compression.codec.warmup_steps == warmup


def test_compressed_phase_changes_the_update():
    """After the warm-up the step is not Adam's: the variance is frozen and the momentum quantized."""
    model, plain = _model(), _model()
    opt = hgc.OnebitAdam(model.named_parameters(), lr=1e-2, warmup_steps=2)
    ref = torch.optim.Adam(plain.parameters(), lr=1e-2)
    for t in range(1, 6):
        _grads(model, t)
        _grads(plain, t)
        opt.step()
        ref.step()
        close = all(torch.allclose(p, q, rtol=1e-6, atol=1e-7) for p, q in zip(model.parameters(), plain.parameters()))
        assert close == (t <= 2), t
    w = model[0].weight
    frozen = opt.state[w]["exp_avg_sq"].clone()
    _grads(model, 9)
    opt.step()
    assert torch.equal(opt.state[w]["exp_avg_sq"], frozen)


def test_checkpoint_resumes_bitwise(tmp_path):
    def run(steps, resume_at=None):
        model = _model()
        opt = hgc.OnebitAdam(model.named_parameters(), lr=1e-2, warmup_steps=3)
        for t in range(1, steps + 1):
            if t == resume_at:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, tmp_path / "ck.pt")
                saved = torch.load(tmp_path / "ck.pt", weights_only=True)
                model = _model(seed=5)
                opt = hgc.OnebitAdam(model.named_parameters(), lr=1e-2, warmup_steps=3)
                model.load_state_dict(saved["model"])
                opt.load_state_dict(saved["opt"])
            _grads(model, t)
            opt.step()
        return model

    straight, resumed = run(10), run(10, resume_at=6)
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)


def test_misuse_is_refused():
    model = _model()
    with pytest.raises(TypeError, match="named_parameters"):
        hgc.OnebitAdam(model.parameters())
    with pytest.raises(TypeError, match="got parameter groups"):
        hgc.OnebitAdam([{"params": list(model.parameters())}])
    with pytest.raises(ValueError, match="warmup_steps must be an int >= 1"):
        hgc.OnebitAdam(model.named_parameters(), warmup_steps=0)
    with pytest.raises(ValueError, match="betas"):
        hgc.OnebitAdam(model.named_parameters(), betas=(1.0, 0.999))
    with pytest.raises(TypeError, match="decoupled is always True"):
        hgc.OnebitAdamW(model.named_parameters(), decoupled=False)
    opt = hgc.OnebitAdam(model.named_parameters())
    with pytest.raises(ValueError, match="no 'compression' part"):
        opt.load_state_dict(torch.optim.Adam(model.parameters()).state_dict())
    emb = torch.nn.Embedding(5, 3, sparse=True)
    opt = hgc.OnebitAdam(emb.named_parameters())
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(TypeError, match="sparse gradient"):
        opt.step()


def test_skips_a_non_finite_step():
    model = _model()
    opt = hgc.OnebitAdam(model.named_parameters(), lr=1e-2, warmup_steps=2)
    for t in range(1, 4):
        _grads(model, t)
        opt.step()
    before = [p.clone() for p in model.parameters()]
    _grads(model, 4)
    model[0].weight.grad[0, 0] = float("nan")
    opt.step()
    assert opt.skipped_steps == 1
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
