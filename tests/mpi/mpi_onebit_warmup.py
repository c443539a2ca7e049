"""onebit's dense warm-up and rows mode through stock hvd.DistributedOptimizer under mpirun.

Run by tests/test_mpi_suites.py as
``mpirun -np N python -m pytest -o python_files='mpi_*.py' tests/mpi``.
"""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.stripes import balanced_ranges
from horovod_gradcomp.exchange.preamble import PREAMBLE_BYTES
from horovod_gradcomp.exchange.stats import allgather_wire_bytes

from .mpi_helpers import assert_identical_across_ranks, gather_tensors, init, needs_peers, onebit_unramped

RANK, SIZE = init()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))


def batch(step, n=8):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def local_step(model, opt, step):
    """Backward on this rank's batch, synchronize(); returns this rank's local gradients."""
    opt.zero_grad()
    x, y = batch(step)
    local = {}
    for n, p in model.named_parameters():
        p.register_hook(lambda g, n=n: local.__setitem__(n, g.detach().clone()))
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.synchronize()
    return local


@needs_peers
@pytest.mark.parametrize("pattern", ["allgather", "two_phase"])
def test_warmup_steps_are_the_exact_mean_then_onebit_from_zero_residuals(pattern):
    model = make_model()
    warm = 2
    comp = onebit_unramped(model.named_parameters(), warmup_steps=warm, pattern=pattern)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    ref = hgc.get_codec("onebit", impl="reference")
    residual = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    numel = sum(p.numel() for p in model.parameters())
    for step in range(warm + 2):
        local = local_step(model, opt, step)
        for n, p in model.named_parameters():
            every = gather_tensors(local[n])
            if step < warm:  # bitwise: the sum in rank order, divided by K
                total = every[0].clone()
                for j in range(1, SIZE):
                    total += every[j]
                assert torch.equal(p.grad, total / SIZE), (step, n)
                assert n not in comp.memory.residuals
            elif pattern == "allgather":  # onebit, residuals from zero at step `warm`
                v = every + gather_tensors(residual[n])
                decoded = torch.stack([ref.decode(ref.encode(v[k].clone())) for k in range(SIZE)])
                expected = decoded.double().mean(0).float()
                residual[n] = v[RANK] - decoded[RANK]
                torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-6)
                torch.testing.assert_close(comp.memory.residuals[n], residual[n], rtol=1e-5, atol=1e-6)
        if step == warm - 1:  # the warm-up's bytes: dense payloads and a reduce-scatter + allgather
            s = comp.stats()
            mine = [b - a for a, b in balanced_ranges(numel, SIZE)][RANK] * 4
            sent = 4 * numel - mine + (SIZE - 1) * mine
            assert s["bytes_payload"] == warm * 4 * numel == s["bytes_payload_dense"]
            assert s["bytes_sent"] == warm * (sent + allgather_wire_bytes(PREAMBLE_BYTES, SIZE))
        with opt.skip_synchronize():
            opt.step()
    s = comp.stats()
    assert s["steps"] == warm + 2 and s["bytes_payload"] < (warm + 2) * 4 * numel
    assert_identical_across_ranks(model)


@needs_peers
@pytest.mark.parametrize("pattern", ["allgather", "two_phase"])
def test_rows_mode_trains_to_identical_parameters(pattern):
    model = make_model()
    comp = hgc.Compression.onebit(model.named_parameters(), scales="rows", pattern=pattern)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    for step in range(4):
        local_step(model, opt, step)
        with opt.skip_synchronize():
            opt.step()
    assert_identical_across_ranks(model)
    codec = hgc.get_codec("onebit", scales="rows")
    payload = sum(codec.payload_nbytes(p.shape, p.dtype) for p in model.parameters())
    if pattern == "allgather":
        assert payload <= comp.stats()["bytes_payload"] / 4 < payload + 8


@needs_peers
@pytest.mark.parametrize("pattern", ["allgather", "two_phase"])
@pytest.mark.parametrize("scales", ["columns", "rows"])
def test_ramp_scales_the_results_and_nothing_else(pattern, scales):
    """Two copies of a model, one compression with ``lr_warmup_steps`` and one without, the same
    batches and lr 0 (the parameters stay equal): step t's averaged gradients with the ramp are
    bitwise those without it times (t + 1) / N, on every rank; residuals and bytes the same."""
    from horovod_gradcomp.exchange.step_ramp import ramp_factor
    n_ramp, models, comps, opts = 3, [], [], []
    for tag, options in (("ramped", {"lr_warmup_steps": n_ramp}), ("plain", {})):
        model = make_model()
        named = [(f"{tag}.{n}", p) for n, p in model.named_parameters()]
        comp = hgc.Compression.onebit(named, scales=scales, pattern=pattern, **options)
        opts.append(hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0), named_parameters=named,
                                             compression=comp))
        models.append(model)
        comps.append(comp)
    for step in range(n_ramp + 1):
        for model, opt in zip(models, opts):
            local_step(model, opt, step)
        for (n, p), q in zip(models[0].named_parameters(), models[1].parameters()):
            assert torch.equal(p.grad, q.grad * ramp_factor(n_ramp, step)), (step, n)
            every = gather_tensors(p.grad)
            assert all(torch.equal(every[k], every[0]) for k in range(SIZE)), (step, n)
        for model, opt in zip(models, opts):
            with opt.skip_synchronize():
                opt.step()
    for (n, r), (m, s) in zip(sorted(comps[0].memory.residuals.items()), sorted(comps[1].memory.residuals.items())):
        assert n.split(".", 1)[1] == m.split(".", 1)[1] and torch.equal(r, s), n
    counts = [{k: v for k, v in c.stats().items() if not k.endswith("_s")} for c in comps]
    assert counts[0] == counts[1]
