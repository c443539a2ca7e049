"""Sparse gradients through the DDP hook (issue 30), under mpirun (-np 1-4, gloo).

A model mixing a sparse embedding (``nn.Embedding(sparse=True)``: DDP gives its gradient a
bucket of its own) and dense layers trains with every codec at its defaults, with SGD and with
Adam/SparseAdam: after each backward the embedding's gradient is the mean of the ranks' own
sparse gradients (from a plain copy of the model, gathered through Horovod), the dense ones went
through the codec, and after each step every rank holds bitwise the same parameters.
"""
from __future__ import annotations

import copy
import warnings

import horovod.torch as hvd
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import horovod_gradcomp as hgc

from .mpi_helpers import assert_identical_across_ranks, init, init_gloo

RANK, SIZE = init()
STEPS = 4
VOCAB, DIM = 40, 6


def setup_module(module):
    init_gloo("ddp_sparse")


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM, sparse=True)
        self.fc1 = nn.Linear(DIM, 24)
        self.fc2 = nn.Linear(24, 3)

    def forward(self, idx):
        return self.fc2(torch.tanh(self.fc1(self.emb(idx).mean(1))))


def _batch(step, rank):
    gen = torch.Generator().manual_seed(100 * step + rank)
    # rank-dependent tokens, some shared between ranks, some repeated within a batch
    idx = torch.randint(0, VOCAB // 2, (8, 5), generator=gen) + (rank % 2) * (VOCAB // 4)
    return idx, torch.randint(0, 3, (8,), generator=gen)


def _optimizers(model, kind):
    if kind == "sgd":
        return [torch.optim.SGD(model.parameters(), lr=0.1)]
    dense = [p for n, p in model.named_parameters() if not n.endswith("emb.weight")]
    return [torch.optim.Adam(dense, lr=1e-2), torch.optim.SparseAdam([model.module.emb.weight], lr=1e-2)]


@pytest.mark.parametrize("kind", ["sgd", "adam"])
@pytest.mark.parametrize("codec", sorted(hgc.available_codecs()))
def test_sparse_embedding_and_dense_layers_train_with_every_codec(codec, kind):
    torch.manual_seed(0)
    plain = Mixed()
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.001)
    state = hgc.ddp.register(ddp, codec)
    opts = _optimizers(ddp, kind)
    before = ddp.module.emb.weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # DGC under Adam says it runs without momentum
        for step in range(STEPS):
            idx, y = _batch(step, RANK)
            for o in opts:
                o.zero_grad()
            F.cross_entropy(ddp(idx), y).backward()
            with torch.no_grad():   # this rank's own gradient, from a copy with the same parameters
                for p, q in zip(plain.parameters(), ddp.module.parameters()):
                    p.copy_(q)
            plain.zero_grad()
            F.cross_entropy(plain(idx), y).backward()
            grad = ddp.module.emb.weight.grad
            assert grad.is_sparse, f"{codec}: the embedding's gradient should stay sparse"
            every = hvd.allgather(plain.emb.weight.grad.to_dense().unsqueeze(0), name=f"hgc.sparse.{codec}.{kind}")
            torch.testing.assert_close(grad.to_dense(), every.mean(0), rtol=1e-6, atol=1e-7,
                                       msg=lambda m: f"{codec}/{kind} step {step}: the sparse mean differs: {m}")
            for p in (ddp.module.fc1.weight, ddp.module.fc2.weight):
                assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
            for o in opts:
                o.step()
            assert_identical_across_ranks(ddp.module)
    assert not torch.equal(ddp.module.emb.weight, before), "the embedding was not trained"
    stats = state.stats()
    assert stats["steps"] == STEPS and (stats["bytes_sent"] > 0) == (SIZE > 1)
    assert all(len(b) and "emb.weight" not in " ".join(b) for b in state.last_partition)


@pytest.mark.parametrize("codec", sorted(hgc.available_codecs()))
def test_sparse_as_dense_compresses_the_dense_copy(codec):
    """``sparse_as_dense=True``: the embedding's dense copy goes through the codec as one more
    bucket (in the partition, bitwise what the engine makes of the same buckets), and the mean
    comes back into its sparse gradient."""
    torch.manual_seed(1)
    plain = Mixed()
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.001)
    state = hgc.ddp.register(ddp, codec, sparse_as_dense=True)
    extra = {"check_optimizer": False, "momentum": 0.0} if codec == "dgc" else {}   # the hook's DGC: no optimizer, 0
    by_engine = getattr(hgc.Compression, codec)(list(plain.named_parameters()), transport="mpi", **extra)
    for step in range(2):
        idx, y = _batch(step, RANK)
        ddp.zero_grad()
        F.cross_entropy(ddp(idx), y).backward()
        plain.zero_grad()
        F.cross_entropy(plain(idx), y).backward()
        partition = state.last_partition
        assert any("emb.weight" in n for b in partition for n in b), partition
        local = {n: (p.grad.to_dense() if p.grad.is_sparse else p.grad).clone() for n, p in plain.named_parameters()}
        want = by_engine.engine.exchange(local, partition=partition)
        by_engine.index.end_step()
        for n, p in ddp.module.named_parameters():
            got = p.grad.to_dense() if p.grad.is_sparse else p.grad
            assert torch.equal(got, want[n]), f"{codec} step {step}: {n}"
        assert ddp.module.emb.weight.grad.is_sparse
        with torch.no_grad():
            for (n, p), q in zip(plain.named_parameters(), ddp.module.parameters()):
                p -= 0.1 * want[n]
                q -= 0.1 * want[n]
    assert_identical_across_ranks(ddp.module)


def test_sparse_nonfinite_skips_the_step_everywhere():
    """A NaN in one rank's embedding gradient: every result of the step is NaN on every rank
    (the sparse mean and the codec's results alike), as for a dense bucket."""
    torch.manual_seed(0)
    ddp = nn.parallel.DistributedDataParallel(Mixed(), bucket_cap_mb=0.001)
    state = hgc.ddp.register(ddp, "onebit")
    bad_rank = SIZE - 1

    def poison(grad):
        if RANK == bad_rank:
            grad = grad.coalesce()
            values = grad.values().clone()
            values[0, 0] = float("nan")
            return torch.sparse_coo_tensor(grad.indices(), values, grad.shape)
        return grad
    handle = ddp.module.emb.weight.register_hook(poison)
    idx, y = _batch(0, RANK)
    F.cross_entropy(ddp(idx), y).backward()
    handle.remove()
    assert torch.isnan(ddp.module.emb.weight.grad.coalesce().values()).all()
    assert all(torch.isnan(p.grad).all() for n, p in ddp.module.named_parameters() if not n.startswith("emb"))
    assert state.stats()["nonfinite_steps"] == 1
