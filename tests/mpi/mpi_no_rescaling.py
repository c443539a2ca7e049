"""The user's gradient stays the user's (issue 30), under mpirun with real Horovod (-np 1-4).

* Horovod 0.28.1's own ``test_gradient_clipping`` scenario (test/parallel/test_torch.py:
  ``optimizer.synchronize()``, ``clip_grad_norm_``, then ``optimizer.step()`` under
  ``skip_synchronize()``), with every codec at its defaults as the ``compression=``: the
  gradient the script reads after ``synchronize()`` is the mean gradient, so clipping clips.
* What ``synchronize()`` returns equals the mean of the codec's own ``decode`` of the very
  payloads the ranks exchanged (recorded where the pattern receives them), at step 0 and later
  steps, for every codec at its defaults: no default rescales the averaged gradient.
"""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch
import torch.nn.functional as F

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Payload

from .mpi_helpers import init, needs_peers

RANK, SIZE = init()
CODECS = sorted(hgc.available_codecs())


def test_every_codec_is_covered():
    assert CODECS == ["dgc", "onebit", "qsgd", "terngrad"]


@needs_peers
@pytest.mark.parametrize("codec", CODECS)
def test_gradient_clipping(codec):
    """Horovod's scenario as its test writes it, ``compression=`` the codec at its defaults."""
    x = torch.ones(1, 1).requires_grad_()
    y = torch.ones(1, 1).requires_grad_()
    model = torch.nn.Linear(1, 1)
    model.weight = torch.nn.Parameter(torch.zeros(1, 1) + 0.5)
    model.bias = torch.nn.Parameter(torch.zeros(1))
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    compression = getattr(hgc.Compression, codec)(model.named_parameters())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    y_pred = model(x)
    loss = F.mse_loss(y_pred, y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.synchronize()
    prior_grad = model.weight.grad.item()
    # d/dw (0.5 - 1)^2 = -1 on every rank: every codec sends one value exactly, so the mean is -1
    assert prior_grad == pytest.approx(-1.0, rel=1e-6), f"{codec}: the averaged gradient was rescaled"
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    clipped_grad = model.weight.grad.item()
    assert abs(prior_grad) > abs(clipped_grad)
    with optimizer.skip_synchronize():
        optimizer.step()
    assert model.weight.item() == pytest.approx(0.5 - 0.1 * clipped_grad, rel=1e-6)
    assert compression.stats()["steps"] == 1


def _unstack(stacked: Payload):
    """The K payloads of a stacked payload (buffers ``[K, n]``), rank order."""
    k = next(iter(stacked.buffers.values())).shape[0]
    return [Payload({b: t[i] for b, t in stacked.buffers.items()}, stacked.shape, stacked.dtype, stacked.device)
            for i in range(k)]


def _record_received(compression):
    """name -> the K payloads the allgather pattern received for it in the current step."""
    pattern = compression.engine.patterns["allgather"]
    seen = {}
    decode_stacked, decode_lists = pattern.decode_stacked, pattern.decode_lists

    def stacked(unpacked, bucket, results):
        unpacked = list(unpacked)
        seen.update((n, _unstack(s)) for n, s in unpacked)
        return decode_stacked(unpacked, bucket, results)

    def lists(decoded, bucket, results):
        seen.update((n, [d[n] for d in decoded]) for n in bucket.names)
        return decode_lists(decoded, bucket, results)
    pattern.decode_stacked, pattern.decode_lists = stacked, lists
    return seen


@needs_peers
@pytest.mark.parametrize("codec", CODECS)
def test_synchronize_returns_the_mean_of_the_codecs_own_decode(codec):
    """Every step (0 to 3; the ranks' batches differ): ``p.grad`` after ``synchronize()`` is
    (1/K) sum_k codec.decode(payload_k) of the payloads exchanged for it (the model is small,
    so every default pattern is the allgather, whose received payloads are recorded)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    compression = getattr(hgc.Compression, codec)(model.named_parameters())
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters(), compression=compression)
    received = _record_received(compression)
    for step in range(4):
        gen = torch.Generator().manual_seed(100 * step + RANK)
        x, y = torch.randn(8, 10, generator=gen), torch.randint(0, 3, (8,), generator=gen)
        received.clear()
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.synchronize()
        assert sorted(received) == sorted(n for n, _ in model.named_parameters()), f"{codec} step {step}"
        for name, p in model.named_parameters():
            payloads = received[name]
            assert len(payloads) == SIZE
            want = torch.stack([compression.codec.decode(q).double() for q in payloads]).mean(0).to(p.dtype)
            assert want.abs().sum() > 0, f"{codec} step {step}: {name} decodes to zero"
            torch.testing.assert_close(p.grad, want, rtol=1e-5, atol=1e-7,
                                       msg=lambda m: f"{codec} step {step} {name}: {m}")
        with optimizer.skip_synchronize():
            optimizer.step()
    assert compression.stats()["steps"] == 4
