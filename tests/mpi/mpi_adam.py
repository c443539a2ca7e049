"""Every codec with Adam and AdamW through Horovod, without flags (issue 30), under mpirun.

A small classifier trains 40 steps with ``hvd.DistributedOptimizer(torch.optim.Adam/AdamW(...),
compression=hgc.Compression.<codec>(model.named_parameters()))``, each codec at its defaults:
the loss falls, every rank holds bitwise the same parameters, and DGC (whose momentum
correction is SGD's) runs with momentum 0 and says so in a warning instead of refusing.
"""
from __future__ import annotations

import warnings

import horovod.torch as hvd
import pytest
import torch
import torch.nn.functional as F

import horovod_gradcomp as hgc
from horovod_gradcomp.hvd_adapter import optimizer_check

from .mpi_helpers import assert_identical_across_ranks, init, needs_peers

RANK, SIZE = init()
STEPS = 40


def _data(step):
    """A fixed linear 3-class task; each rank and step its own batch."""
    gen = torch.Generator().manual_seed(10_000 * RANK + step)
    x = torch.randn(32, 10, generator=gen)
    w = torch.Generator().manual_seed(7)
    y = (x @ torch.randn(10, 3, generator=w)).argmax(1)
    return x, y


@needs_peers
@pytest.mark.parametrize("optimizer", ["Adam", "AdamW"])
@pytest.mark.parametrize("codec", sorted(hgc.available_codecs()))
def test_codec_trains_with_adam(codec, optimizer, monkeypatch):
    monkeypatch.setattr(optimizer_check, "_warned_without_momentum", False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    compression = getattr(hgc.Compression, codec)(model.named_parameters())
    opt = hvd.DistributedOptimizer(getattr(torch.optim, optimizer)(model.parameters(), lr=1e-2),
                                   named_parameters=model.named_parameters(), compression=compression)
    losses = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step in range(STEPS):
            x, y = _data(step)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(float(hvd.allreduce(loss.detach(), name="hgc.test.adam.loss")))
    said = [str(w.message) for w in caught if "not SGD: DGC runs without" in str(w.message)]
    if codec == "dgc":
        assert len(said) == 1 and f"optimizer is {optimizer}" in said[0], said
        assert compression.memory.momentum == 0.0
    else:
        assert not said
    # the loss falls (DGC's default density 0.001 sends one value of each of these small tensors a
    # step: it falls by about a quarter in 40 steps, the others by more)
    assert sum(losses[-5:]) / 5 < 0.85 * sum(losses[:5]) / 5, f"{codec} with {optimizer}: {losses}"
    assert compression.stats()["steps"] == STEPS
    assert_identical_across_ranks(model)
    # the codec's Adam defaults, taken at the first compress on every rank (adam_defaults.py)
    assert compression.adapted_options == type(compression.codec).adam_defaults
    assert all(getattr(compression.codec, k) == v for k, v in compression.adapted_options.items())


@needs_peers
@pytest.mark.parametrize("codec", ["dgc", "onebit", "terngrad"])
@pytest.mark.parametrize("given", [False, True])
def test_ddp_hook_takes_the_adam_defaults(codec, given):
    """The DDP hook never sees the optimizer: with optimizer= the Adam defaults hold from the
    first step, without it from the optimizer's first step() on; ranks stay identical."""
    import copy
    from .mpi_helpers import init_gloo
    init_gloo("adam_defaults")
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3))
    ddp = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.001)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-2)
    state = hgc.ddp.register(ddp, codec, **({"optimizer": opt} if given else {}))
    comp = state.compression
    expected = type(comp.codec).adam_defaults
    assert comp.adapted_options == (expected if given else {})
    for step in range(3):
        x, y = _data(step)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
        assert comp.adapted_options == expected
    assert_identical_across_ranks(ddp.module)


@needs_peers
def test_dgc_explicit_momentum_with_adam_is_refused_on_every_rank():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    compression = hgc.Compression.dgc(model.named_parameters(), momentum=0.9)
    opt = hvd.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=1e-2),
                                   named_parameters=model.named_parameters(), compression=compression)
    for p in model.parameters():   # no backward: no hook submits a gradient that no step exchanges
        p.grad = torch.ones_like(p)
    with pytest.raises(hgc.OptimizerMismatchError, match="momentum=0.9 is SGD's momentum.*Adam"):
        opt.step()   # the pre-step check raises before any exchange, on every rank
