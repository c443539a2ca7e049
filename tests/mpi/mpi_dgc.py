"""DGC through stock hvd.DistributedOptimizer under mpirun, against independently written loops.

Gradients are chosen, not computed: the loss is ``sum(p * c)`` with ``c`` a per-rank,
per-step tensor of multiples of 1/16, so ``p.grad == c`` exactly. With momentum 1/2, a
learning rate of 1/4 and K in {1, 2, 4}, every intermediate value is a short dyadic
fraction and float64 arithmetic is exact: results must be *equal*, whatever order the
operations run in.
"""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.errors import ExchangeMismatchError
from horovod_gradcomp.hvd_adapter.optimizer_check import OptimizerMismatchError

from .mpi_helpers import assert_identical_across_ranks, init, needs_peers

RANK, SIZE = init()
SHAPES = {"a": (5, 3), "b": (7,), "c": (1,)}
LR, MOMENTUM, STEPS = 0.25, 0.5, 8
exact_sizes = pytest.mark.skipif(SIZE not in (1, 2, 4), reason="exact dyadic means need K in {1, 2, 4}")


def grad_for(rank: int, step: int, name: str) -> torch.Tensor:
    """The gradient rank ``rank`` produces for ``name`` at ``step``: multiples of 1/16."""
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + sorted(SHAPES).index(name))
    return torch.randint(-16, 17, SHAPES[name], generator=g).to(torch.float64) / 16


def initial_params() -> dict:
    return {n: torch.arange(torch.Size(s).numel(), dtype=torch.float64).reshape(s) / 8 for n, s in SHAPES.items()}


def smooth_grad_for(rank: int, step: int, name: str) -> torch.Tensor:
    """Gaussian gradients: no ties among magnitudes, so top-k is unambiguous."""
    g = torch.Generator().manual_seed(1000 * step + 10 * rank + sorted(SHAPES).index(name))
    return torch.randn(SHAPES[name], generator=g, dtype=torch.float64)


def run_hvd(compression_factory, steps=STEPS, grad_fn=grad_for, op=None):
    """Parameters after each step when every rank trains through Horovod with this compression
    (``op``: Horovod's reduction, its default Average when None)."""
    params = {n: torch.nn.Parameter(t.clone()) for n, t in initial_params().items()}
    comp = compression_factory(list(params.items()))
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params.values(), lr=LR, momentum=0),
                                   named_parameters=list(params.items()), compression=comp,
                                   **({} if op is None else {"op": op}))
    history = []
    for step in range(steps):
        opt.zero_grad()
        sum((p * grad_fn(RANK, step, n)).sum() for n, p in params.items()).backward()
        opt.step()
        history.append({n: p.detach().clone() for n, p in params.items()})
    return history, comp


def mean_grad(step: int, name: str) -> torch.Tensor:
    return sum(grad_for(k, step, name) for k in range(SIZE)) / SIZE


@needs_peers
@exact_sizes
def test_density_one_without_masking_is_dense_momentum_sgd_exactly():
    history, _ = run_hvd(lambda named: hgc.Compression.dgc(named, density=1.0, momentum=MOMENTUM,
                                                           momentum_masking=False))
    # Momentum SGD on the averaged gradient, written out: buf <- m buf + mean g; w <- w - lr buf.
    w, buf = initial_params(), {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    for step in range(STEPS):
        for n in SHAPES:
            buf[n] = MOMENTUM * buf[n] + mean_grad(step, n)
            w[n] = w[n] - LR * buf[n]
            assert torch.equal(history[step][n], w[n]), f"step {step} {n}: {history[step][n]} != {w[n]}"


@needs_peers
@exact_sizes
def test_density_one_with_masking_is_plain_sgd():
    history, _ = run_hvd(lambda named: hgc.Compression.dgc(named, density=1.0, momentum=MOMENTUM))
    w = initial_params()
    for step in range(STEPS):
        for n in SHAPES:
            w[n] = w[n] - LR * mean_grad(step, n)
            assert torch.equal(history[step][n], w[n]), f"step {step} {n}"


def dgc_reference_run(momentum, clip_norm, masking, steps, schedule, grad_fn, summed=False):
    """DGC written out for every rank at once, with exact top-k (torch.topk) selection. Each
    rank clips its gradient to C sqrt(K) when the ranks' updates are averaged, C / sqrt(K) when
    they are summed (``summed``)."""
    limit = (clip_norm / SIZE ** 0.5 if summed else clip_norm * SIZE ** 0.5) if clip_norm else None
    u = [{n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()} for _ in range(SIZE)]
    v = [{n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()} for _ in range(SIZE)]
    w, history = initial_params(), []
    for step in range(steps):
        d = schedule(step)
        update = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
        for k in range(SIZE):
            g = {n: grad_fn(k, step, n) for n in SHAPES}
            norm = torch.sqrt(sum((t * t).sum() for t in g.values()))
            coef = min(1.0, limit / (float(norm) + 1e-6)) if clip_norm else 1.0
            for n in SHAPES:
                u[k][n] = momentum * u[k][n] + coef * g[n]
                v[k][n] = v[k][n] + u[k][n]
                flat = v[k][n].reshape(-1)
                count = max(1, -(-flat.numel() * d // 1)) if d < 1 else flat.numel()
                top = torch.topk(flat.abs(), int(min(count, flat.numel()))).indices
                top = top[flat[top] != 0]
                sent = torch.zeros_like(flat)
                sent[top] = flat[top]
                update[n] += sent.reshape(SHAPES[n])
                mask = sent.reshape(SHAPES[n]) != 0
                v[k][n] = torch.where(mask, torch.zeros_like(v[k][n]), v[k][n])
                if masking:
                    u[k][n] = torch.where(mask, torch.zeros_like(u[k][n]), u[k][n])
        for n in SHAPES:
            w[n] = w[n] - LR * (update[n] if summed else update[n] / SIZE)
        history.append({n: t.clone() for n, t in w.items()})
    return history


@needs_peers
@pytest.mark.parametrize("summed", [False, True])
def test_sparse_dgc_with_clipping_masking_and_warmup_matches_an_independent_loop(summed):
    schedule = hgc.DensitySchedule(0.1, start=0.5, length=3, unit="step")
    history, comp = run_hvd(lambda named: hgc.Compression.dgc(
        named, impl="reference", density=0.1, momentum=0.9, clip_norm=0.5, warmup_start=0.5, warmup_length=3,
        warmup_unit="step"), grad_fn=smooth_grad_for, op=hvd.Sum if summed else None)
    expected = dgc_reference_run(0.9, 0.5, True, STEPS, schedule.density, smooth_grad_for, summed=summed)
    for step in range(STEPS):
        for n in SHAPES:
            torch.testing.assert_close(history[step][n], expected[step][n], rtol=1e-12, atol=1e-12,
                                       msg=f"step {step} {n}")
    assert comp.memory.step == STEPS
    assert comp.memory.reduction == ("sum" if summed else "mean")
    assert comp.codec.density == 0.1


@needs_peers
def test_parameters_identical_across_ranks_with_native_selection():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.ReLU(), torch.nn.Linear(64, 5))
    comp = hgc.Compression.dgc(model.named_parameters(), density=0.01, warmup_length=2, warmup_unit="epoch")
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for epoch in range(3):
        comp.set_epoch(epoch)
        for step in range(3):
            g = torch.Generator().manual_seed(100 * epoch + 10 * step + RANK)
            opt.zero_grad()
            x, y = torch.randn(16, 40, generator=g), torch.randint(0, 5, (16,), generator=g)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    assert_identical_across_ranks(model)


@needs_peers
def test_ranks_in_different_epochs_raise_on_every_rank():
    params = {n: torch.nn.Parameter(t.clone()) for n, t in initial_params().items()}
    comp = hgc.Compression.dgc(list(params.items()), density=0.1, warmup_length=4, warmup_unit="epoch")
    comp.set_epoch(RANK % 2)  # ranks 0 and 1 disagree on the warm-up density
    for n, p in params.items():
        p.grad = grad_for(RANK, 0, n)
    names = [comp.compress(p.grad)[1] for p in params.values()]
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        comp.decompress(torch.ones(1), names[0])


def test_explicit_momentum_with_momentum_in_the_wrapped_optimizer_raises_before_the_first_step():
    params = {n: torch.nn.Parameter(t.clone()) for n, t in initial_params().items()}
    comp = hgc.Compression.dgc(list(params.items()), density=0.5, momentum=0.9)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params.values(), lr=0.1, momentum=0.9),
                                   named_parameters=list(params.items()), compression=comp)
    with pytest.raises(OptimizerMismatchError, match="momentum=0"):
        opt.step()  # raised by the pre-step check, before any exchange, on every rank


@needs_peers
def test_default_momentum_is_taken_from_the_wrapped_optimizer():
    """momentum=None: SGD(momentum=m) hands m to the compression and keeps none itself, which
    gives bitwise what the explicit form gives; plain SGD stays plain SGD."""
    def run(momentum_in_sgd, dgc_momentum):
        params = {n: torch.nn.Parameter(t.clone()) for n, t in initial_params().items()}
        comp = hgc.Compression.dgc(list(params.items()), density=1.0, momentum_masking=False,
                                   **({} if dgc_momentum is None else {"momentum": dgc_momentum}))
        sgd = torch.optim.SGD(params.values(), lr=LR, momentum=momentum_in_sgd)
        opt = hvd.DistributedOptimizer(sgd, named_parameters=list(params.items()), compression=comp)
        for step in range(STEPS):
            opt.zero_grad()
            sum((p * grad_for(RANK, step, n)).sum() for n, p in params.items()).backward()
            opt.step()
        return params, comp, sgd

    adopted, comp, sgd = run(MOMENTUM, None)
    explicit, _, _ = run(0.0, MOMENTUM)
    assert comp.memory.momentum == MOMENTUM and all(g["momentum"] == 0 for g in sgd.param_groups)
    for n in adopted:
        assert torch.equal(adopted[n], explicit[n]), n
    _, plain, _ = run(0.0, None)
    assert plain.memory.momentum == 0.0
