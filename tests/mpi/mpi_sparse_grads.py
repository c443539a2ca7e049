"""Sparse gradients as Horovod handles them, with every codec (mpirun -np 1..4; needs peers).

A model with a sparse embedding and dense layers: with ``sparse_as_dense=False`` Horovod
allgathers the embedding's gradient itself and the compression hands it back untouched; with
``sparse_as_dense=True`` the dense copy is compressed like any gradient. Either way every rank
ends with the same parameters, and ``stats()`` counts exactly the compressed tensors.
"""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc

from .mpi_helpers import assert_identical_across_ranks, init, needs_peers

RANK, SIZE = init()
STEPS = 3
CODECS = {
    "onebit": {},
    "terngrad": {},
    "qsgd": {"bits": 4},
    "dgc": {"density": 0.3, "momentum": 0.9, "check_optimizer": False},
}


class SparseNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(20, 6, sparse=True)
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 3)

    def forward(self, idx):
        return self.fc2(torch.tanh(self.fc1(self.emb(idx).mean(1))))


def train(comp_of, sparse_as_dense: bool, steps: int = STEPS):
    torch.manual_seed(0)
    model = SparseNet()
    comp = comp_of(model)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp,
                                   sparse_as_dense=sparse_as_dense)
    for step in range(steps):
        g = torch.Generator().manual_seed(100 * step + RANK)
        opt.zero_grad()
        out = model(torch.randint(0, 20, (4, 5), generator=g))
        torch.nn.functional.cross_entropy(out, torch.randint(0, 3, (4,), generator=g)).backward()
        opt.step()
    return model, comp


@needs_peers
@pytest.mark.parametrize("sparse_as_dense", [False, True], ids=["sparse", "as_dense"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_sparse_embedding_trains_alike_on_every_rank(codec, sparse_as_dense):
    def make(model):
        return getattr(hgc.Compression, codec)(model.named_parameters(), **CODECS[codec])
    model, comp = train(make, sparse_as_dense)
    assert_identical_across_ranks(model)
    stats = comp.stats()
    compressed = 5 if sparse_as_dense else 4  # emb.weight only when densified
    assert stats["steps"] == STEPS and stats["tensors"] == STEPS * compressed, stats
    assert stats["bytes_payload"] > 0
    torch.manual_seed(0)
    initial = SparseNet()
    assert not torch.equal(initial.emb.weight, model.emb.weight), "the embedding did not train"


@needs_peers
@pytest.mark.parametrize("codec", list(CODECS))
def test_sparse_gradient_is_horovods_own_allgather(codec):
    """After one step the embedding (whose gradient depends only on the initial parameters) equals
    bitwise what plain Horovod makes of it: the compression did not touch it."""
    def make(model):
        return getattr(hgc.Compression, codec)(model.named_parameters(), **CODECS[codec])
    ours, _ = train(make, False, steps=1)
    plain, _ = train(lambda model: hgc.Compression.none(), False, steps=1)
    assert torch.equal(ours.emb.weight, plain.emb.weight)


@needs_peers
@pytest.mark.parametrize("wire", ["none", "fp16"])
def test_dense_compressions_pass_sparse_gradients_through(wire):
    model, comp = train(lambda model: getattr(hgc.Compression, wire)(), False)
    assert_identical_across_ranks(model)
    assert comp.stats()["tensors"] == STEPS * 4
