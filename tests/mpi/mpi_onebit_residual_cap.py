"""onebit's ``residual_cap`` through stock hvd.DistributedOptimizer under mpirun (-np 2, 4).

The cap acts only on what each rank carries to the next step: what ``synchronize()`` returns is
still the mean of every rank's decoded payload of ``g + r`` (no rescaling), and each rank's
residual is the pure-torch reference's, each row capped at ``residual_cap`` times that row's
gradient norm. Run by tests/test_mpi_suites.py.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc

from .mpi_helpers import (LocalGradients, assert_identical_across_ranks, init, needs_peers, onebit_unramped,
                          reference_mean_of_decoded)
from .mpi_onebit import batch, distributed, make_model

RANK, SIZE = init()
CAP = 0.5


def _row_norms(t):
    return t.reshape(t.shape[0], -1).norm(dim=1) if t.dim() >= 2 else t.norm().reshape(1)


def _backward_steps(model, opt, steps: int):
    """For each step: zero the gradients, run the step's batch backward and yield (step, this
    rank's gradients by name before any exchange); the caller synchronizes and steps."""
    grads = LocalGradients(model.named_parameters())
    for step in range(steps):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        yield step, grads.take()


@needs_peers
def test_results_are_the_uncapped_mean_and_residuals_are_capped():
    model = make_model()
    comp = onebit_unramped(model.named_parameters(), residual_cap=CAP, pattern="allgather")
    opt = distributed(model, comp)
    plain = hgc.get_codec("onebit", impl="reference")
    capped = hgc.get_codec("onebit", impl="reference", residual_cap=CAP)
    residual = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    bound = 0
    for step, local in _backward_steps(model, opt, 6):
        opt.synchronize()
        for n, p in model.named_parameters():
            expected, uncapped = reference_mean_of_decoded(plain, local[n] + residual[n])
            torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-6, msg=f"step {step} {n}")
            capped.encode(local[n], residual=residual[n])
            torch.testing.assert_close(comp.memory.residuals[n], residual[n], rtol=1e-5, atol=1e-6,
                                       msg=f"step {step} {n}")
            bound += int(bool((_row_norms(uncapped) > CAP * _row_norms(local[n]) * 1.001).any()))
        with opt.skip_synchronize():
            opt.step()
    assert bound > 0, "the cap never bound: the test would not see it"
    assert_identical_across_ranks(model)


@needs_peers
def test_two_phase_trains_identically_on_every_rank_with_rows_within_the_cap():
    model = make_model()
    comp = onebit_unramped(model.named_parameters(), residual_cap=CAP, pattern="two_phase")
    opt = distributed(model, comp)
    for step, local in _backward_steps(model, opt, 6):
        opt.step()
        for n in local:
            r = comp.memory.residuals[n]
            assert bool((_row_norms(r) <= CAP * _row_norms(local[n]) * (1 + 1e-5) + 1e-7).all()), (step, n)
    assert_identical_across_ranks(model)


def test_the_option_reaches_the_codec():
    model = make_model()
    comp = hgc.Compression.onebit(model.named_parameters(), residual_cap=1.5)
    assert comp.codec.residual_cap == 1.5 and "residual_cap=1.5" in repr(comp.codec)
    with pytest.raises(ValueError, match="residual_cap must be a finite number >= 0"):
        hgc.Compression.onebit(model.named_parameters(), residual_cap=-1)
