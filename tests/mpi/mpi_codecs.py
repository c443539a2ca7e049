"""terngrad and qsgd through stock hvd.DistributedOptimizer under mpirun, checked against the
pure-torch reference codec run independently on every rank (the codecs' random streams are
counter-based, so the reference with the same seed and rank draws the same numbers)."""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.terngrad import TernGradCodec

from .mpi_helpers import LocalGradients, assert_identical_across_ranks, gather_tensors, init, needs_peers

RANK, SIZE = init()


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.Tanh(), torch.nn.Linear(20, 4))


def run_steps(compression, check, steps=4):
    """Train a few steps; after each synchronize() call check(model, local_grads, step)."""
    model = make_model()
    comp = compression(model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    grads = LocalGradients(model.named_parameters())
    for step in range(steps):
        opt.zero_grad()
        g = torch.Generator().manual_seed(step * 31 + RANK)
        x, y = torch.randn(16, 12, generator=g), torch.randint(0, 4, (16,), generator=g)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local = grads.take()
        opt.synchronize()
        check(model, local, step)
        with opt.skip_synchronize():
            opt.step()
    assert_identical_across_ranks(model)
    return comp


@needs_peers
def test_terngrad_scale_is_shared_and_grads_are_the_mean():
    # under torch.optim.SGD the compression takes TernGrad's SGD default (clip at 2.5 sigma)
    ref = hgc.get_codec("terngrad", impl="reference", rank_stream=RANK, **TernGradCodec.sgd_defaults)

    def check(model, local, step):
        params = dict(model.named_parameters())
        for i, n in enumerate(sorted(params)):  # stream position: step * P + sorted index
            ref.reset_stream(step * len(params) + i)
            s = hvd.allreduce(torch.tensor([ref.local_scale(local[n])], dtype=torch.float64), op=hvd.Max)
            payload = ref.encode(local[n], scale=float(s))
            scales = gather_tensors(payload.buffers["scale"])
            assert torch.all(scales == scales[0]), f"{n}: ranks used different scales {scales.tolist()}"
            expected = gather_tensors(ref.decode(payload)).mean(0)
            torch.testing.assert_close(params[n].grad, expected, rtol=1e-6, atol=1e-7)

    comp = run_steps(hgc.Compression.terngrad, check)
    assert comp.stats()["payload_ratio"] > 10
    assert comp.adapted_options == TernGradCodec.sgd_defaults == {"clip": 2.5}


@needs_peers
@pytest.mark.parametrize("coding,norm", [("fixed", "max"), ("elias", "l2")])
def test_qsgd_grads_are_the_mean_of_every_ranks_quantization(coding, norm):
    ref = hgc.get_codec("qsgd", impl="reference", rank_stream=RANK, coding=coding, bucket=64, norm=norm)

    def check(model, local, step):
        params = dict(model.named_parameters())
        for i, n in enumerate(sorted(params)):
            ref.reset_stream(step * len(params) + i)
            expected = gather_tensors(ref.decode(ref.encode(local[n]))).mean(0)
            torch.testing.assert_close(params[n].grad, expected, rtol=1e-5, atol=1e-6)

    run_steps(lambda named: hgc.Compression.qsgd(named, coding=coding, bucket=64, norm=norm), check)
