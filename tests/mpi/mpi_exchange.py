"""The adapter's exchange paths under mpirun with small test codecs (no Horovod hooks):
variable-size payloads (allgather of sizes, then allgatherv) including a rank that sends
nothing, and scales agreed across ranks by one MAX-allreduce."""
from __future__ import annotations

import torch

from horovod_gradcomp.codecs.base import Codec, Payload
from horovod_gradcomp.hvd_adapter.factories import CodecCompression

from .mpi_helpers import gather_tensors, init

RANK, SIZE = init()


class AboveThreshold(Codec):
    """Sends (index, value) of the entries with |g| > threshold: size varies by rank."""
    name = "test_above_threshold"
    variable_size = True

    def __init__(self, threshold):
        super().__init__("reference")
        self.threshold = threshold

    def encode(self, tensor, residual=None):
        flat = tensor.reshape(-1)
        idx = (flat.abs() > self.threshold).nonzero().reshape(-1)
        return Payload({"idx": idx.to(torch.int64), "val": flat[idx].contiguous()}, tensor.shape, tensor.dtype)

    def decode(self, payload, out=None):
        flat = torch.zeros(payload.numel, dtype=payload.dtype)
        flat[payload.buffers["idx"]] = payload.buffers["val"]
        return flat.view(payload.shape) if out is None else out.copy_(flat.view(payload.shape))


class SharedScaleInt8(Codec):
    """round(127 * g / s) as int8 with s agreed across ranks; records the s it was given."""
    name = "test_shared_scale"
    shared_scale = True

    def __init__(self):
        super().__init__("reference")

    def local_scale(self, tensor):
        return float(tensor.abs().max()) if tensor.numel() else 0.0

    def layout(self, shape, dtype):
        return [("q", torch.int8, int(torch.Size(shape).numel())), ("s", torch.float32, 1)]

    def encode(self, tensor, residual=None, scale=None):
        q = torch.round(tensor / scale * 127).to(torch.int8) if scale > 0 else torch.zeros_like(tensor, dtype=torch.int8)
        return Payload({"q": q.reshape(-1), "s": torch.tensor([scale], dtype=torch.float32)}, tensor.shape, tensor.dtype)

    def decode(self, payload, out=None):
        v = (payload.buffers["q"].to(torch.float32) * payload.buffers["s"] / 127).view(payload.shape)
        return v if out is None else out.copy_(v)


def _params(shapes):
    return [(f"p{i}", torch.nn.Parameter(torch.zeros(s))) for i, s in enumerate(shapes)]


def _round_trip(comp, params, grads):
    ctx = []
    for name, p in reversed(params):
        p.grad = grads[name].clone()
        ctx.append(comp.compress(p.grad))
    return {name: comp.decompress(torch.ones(1), name) for _, name in ctx}


def test_variable_size_payloads_with_a_rank_that_sends_nothing():
    params = _params([(5, 4), (9,), (3, 2, 2)])
    comp = CodecCompression(AboveThreshold(threshold=0.5), params, error_feedback=False)
    gen = torch.Generator().manual_seed(RANK)
    # Rank 0 selects nothing at all; the others select a rank-dependent number of entries.
    grads = {n: (torch.zeros(p.shape) if RANK == 0 else torch.randn(p.shape, generator=gen)) for n, p in params}
    got = _round_trip(comp, params, grads)
    for n, _ in params:
        every = gather_tensors(grads[n])
        expected = torch.where(every.abs() > 0.5, every, torch.zeros(())).mean(0)
        torch.testing.assert_close(got[n], expected)
    stats = comp.stats()
    assert stats["steps"] == 1 and stats["tensors"] == len(params)


def test_scales_are_the_maximum_over_ranks_in_one_collective():
    params = _params([(6,), (2, 3)])
    comp = CodecCompression(SharedScaleInt8(), params, error_feedback=False)
    gen = torch.Generator().manual_seed(100 + RANK)
    grads = {n: torch.randn(p.shape, generator=gen) * (RANK + 1) for n, p in params}
    got = _round_trip(comp, params, grads)
    for n, _ in params:
        every = gather_tensors(grads[n])
        s = every.abs().max()
        expected = (torch.round(every / s * 127) * s / 127).mean(0)
        torch.testing.assert_close(got[n], expected)
