"""onebit through stock hvd.DistributedOptimizer under mpirun (-np 1, 2, 4).

Run by tests/test_mpi_suites.py as
``mpirun -np N python -m pytest -o python_files='mpi_*.py' tests/mpi``.
"""
from __future__ import annotations

import copy
import io

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.preamble import PREAMBLE_BYTES
from horovod_gradcomp.errors import ExchangeMismatchError

from .mpi_helpers import (LocalGradients, assert_identical_across_ranks, init, needs_peers, onebit_unramped,
                          reference_mean_of_decoded)

RANK, SIZE = init()


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Conv2d(2, 4, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                               torch.nn.Linear(4 * 4 * 4, 9), torch.nn.ReLU(), torch.nn.Linear(9, 3))


def batch(step, n=8):
    g = torch.Generator().manual_seed(1000 * step + RANK)
    return torch.randn(n, 2, 6, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def distributed(model, compression, lr=0.05, **kw):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    return hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(), compression=compression, **kw)


def check_steps_against_reference(model, comp, opt, forward_backward, steps):
    """Run ``steps`` optimizer steps; after each synchronize(), every p.grad must equal
    mean_k decode(encode(g_k + r_k)), with residuals and decoding done independently by the
    pure-torch reference codec (a parameter without gradient counts as a zero gradient)."""
    ref = hgc.get_codec("onebit", impl="reference")
    residual = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    grads = LocalGradients(model.named_parameters())
    for step in range(steps):
        opt.zero_grad()
        forward_backward(step)
        local = grads.take()
        opt.synchronize()
        for n, p in model.named_parameters():
            expected, residual[n] = reference_mean_of_decoded(ref, local[n] + residual[n])
            torch.testing.assert_close(p.grad, expected, rtol=1e-5, atol=1e-6, msg=f"step {step} {n}")
            torch.testing.assert_close(comp.memory.residuals[n], residual[n], rtol=1e-5, atol=1e-6)
        with opt.skip_synchronize():
            opt.step()


@needs_peers
def test_grads_equal_mean_of_every_ranks_decoded_payload():
    model = make_model()
    comp = onebit_unramped(model.named_parameters())
    opt = distributed(model, comp)

    def forward_backward(step):
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()

    check_steps_against_reference(model, comp, opt, forward_backward, steps=5)


@needs_peers
@pytest.mark.parametrize("error_feedback", [True, False])
def test_parameters_identical_after_20_steps_with_grads_set_to_none(error_feedback):
    model = make_model()
    opt = distributed(model, onebit_unramped(model.named_parameters(), error_feedback=error_feedback))
    before = copy.deepcopy(model.state_dict())
    for step in range(20):
        opt.zero_grad()  # torch 2.x default: set_to_none=True
        assert all(p.grad is None for p in model.parameters())
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        assert all(p.grad is not None for p in model.parameters())
    assert_identical_across_ranks(model)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items()), "training changed nothing"


class TwoBranches(torch.nn.Module):
    """Branch order of the forward pass (hence of the backward hooks) depends on the rank;
    branch `rare` is used only on some steps."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.a = torch.nn.Linear(5, 3)
        self.b = torch.nn.Linear(5, 3)
        self.rare = torch.nn.Linear(5, 3)

    def forward(self, x, use_rare):
        first, second = (self.a, self.b) if RANK % 2 == 0 else (self.b, self.a)
        out = first(x)
        out = out + second(x)
        if use_rare:
            out = out + self.rare(x)
        return out


@needs_peers
def test_hook_order_differs_across_ranks_and_a_parameter_without_gradient():
    model = TwoBranches()
    comp = onebit_unramped(model.named_parameters())
    opt = distributed(model, comp)

    def forward_backward(step):
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(step * 10 + RANK))
        use_rare = step % 3 == 0 and RANK == 0  # only rank 0, only some steps
        model(x, use_rare).pow(2).mean().backward()

    check_steps_against_reference(model, comp, opt, forward_backward, steps=6)
    assert_identical_across_ranks(model)


@needs_peers
def test_op_sum_gives_the_sum_and_backward_passes_per_step():
    """op=hvd.Sum: K times the mean; backward_passes_per_step=2 compresses the sum of two passes."""
    results = {}
    for op in (hvd.Average, hvd.Sum):
        model = make_model()
        opt = distributed(model, onebit_unramped(model.named_parameters()), op=op,
                          backward_passes_per_step=2)
        opt.zero_grad()
        for micro in range(2):
            x, y = batch(micro)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.synchronize()
        results[op] = {n: p.grad.clone() for n, p in model.named_parameters()}
    for n in results[hvd.Average]:
        torch.testing.assert_close(results[hvd.Sum][n], results[hvd.Average][n] * SIZE, rtol=1e-5, atol=1e-6)


@needs_peers
def test_stats_count_what_was_sent():
    model = make_model()
    comp = onebit_unramped(model.named_parameters())
    opt = distributed(model, comp)
    for step in range(3):
        opt.zero_grad()
        x, y = batch(step)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    s = comp.stats()
    numel = sum(p.numel() for p in model.parameters())
    codec = hgc.get_codec("onebit")
    payload = sum(codec.payload_nbytes(p.shape, p.dtype) for p in model.parameters())
    assert s["steps"] == 3 and s["tensors"] == 3 * len(list(model.parameters()))
    assert payload <= s["bytes_payload"] / 3 < payload + 8          # fused buffer padded to 8 bytes
    assert s["bytes_payload_dense"] == 3 * 4 * numel
    assert s["bytes_sent"] == 3 * (SIZE - 1) * (s["bytes_payload"] / 3 + PREAMBLE_BYTES)  # allgather, preamble
    assert s["bytes_dense"] == pytest.approx(3 * 2 * (SIZE - 1) / SIZE * 4 * numel)


def test_direct_compress_decompress_any_size():
    """The adapter without Horovod's hooks (also at -np 1): the mean over ranks of the decoded
    payloads, against the reference codec."""
    params = [("w", torch.nn.Parameter(torch.zeros(6, 5))), ("b", torch.nn.Parameter(torch.zeros(5)))]
    comp = onebit_unramped(params)
    ref = hgc.get_codec("onebit", impl="reference")
    gen = torch.Generator().manual_seed(RANK + 7)
    ctxs, grads = [], {}
    for name, p in reversed(params):
        p.grad = torch.randn(p.shape, generator=gen)
        grads[name] = p.grad.clone()
        ctxs.append((comp.compress(p.grad), name))
    for (placeholder, ctx), name in ctxs:
        got = comp.decompress(torch.ones(1), ctx)
        expected, _ = reference_mean_of_decoded(ref, grads[name])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_mismatched_tensors_raise_on_every_rank():
    """Ranks that disagree on a tensor's shape get a clear error on every rank, no hang."""
    shape = (3 + RANK,) if SIZE > 1 else (3,)
    p = torch.nn.Parameter(torch.zeros(shape))
    comp = onebit_unramped([("p", p)])
    p.grad = torch.ones(shape)
    _, ctx = comp.compress(p.grad)
    if SIZE == 1:
        comp.decompress(torch.ones(1), ctx)
        return
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        comp.decompress(torch.ones(1), ctx)


def test_unknown_tensor_is_a_clear_error():
    comp = onebit_unramped([("p", torch.nn.Parameter(torch.zeros(3)))])
    with pytest.raises(LookupError, match="not the .grad of any parameter"):
        comp.compress(torch.ones(3))


@needs_peers
def test_state_dict_round_trip_continues_identically():
    def run(steps, comp, model, opt, start):
        for step in range(start, start + steps):
            opt.zero_grad()
            x, y = batch(step)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    model = make_model()
    comp = onebit_unramped(model.named_parameters())
    opt = distributed(model, comp)
    run(3, comp, model, opt, 0)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "comp": comp.state_dict()}, buf)
    run(3, comp, model, opt, 3)
    straight = [p.detach().clone() for p in model.parameters()]

    buf.seek(0)
    saved = torch.load(buf, weights_only=True)
    model2 = make_model(seed=5)
    model2.load_state_dict(saved["model"])
    comp2 = onebit_unramped(model2.named_parameters())
    comp2.load_state_dict(saved["comp"])
    opt2 = distributed(model2, comp2)
    run(3, comp2, model2, opt2, 3)
    for a, b in zip(straight, model2.parameters()):
        assert torch.equal(a, b.detach())
