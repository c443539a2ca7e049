"""Ranks that build different compressions fail on every rank at the first step, under mpirun
(-np 1..4; the cases need peers): each pair of codecs, different patterns, one rank with plain
Horovod while the others compress, compressions used in a different order. Compressions built
in a different order but used in the same one train as usual, on either transport.

Construction performs no collective (the communicator's duplicate is made by the first
exchange), so every rank reaches the preamble of the first bucket, which names the
disagreement on every rank (:class:`ExchangeMismatchError`).
"""
from __future__ import annotations

import itertools
from typing import Optional

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.errors import ExchangeMismatchError

from .mpi_helpers import assert_identical_across_ranks, init, needs_peers

RANK, SIZE = init()
CODECS = {  # factory -> options
    "onebit": {},
    "terngrad": {},
    "qsgd": {"bits": 4},
    "dgc": {"density": 0.2, "momentum": 0.9, "check_optimizer": False},
}


def make_model(seed: int = 0, width: int = 8) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, width), torch.nn.Tanh(), torch.nn.Linear(width, 3))


def compression(codec: str, model: torch.nn.Module, **extra):
    return getattr(hgc.Compression, codec)(model.named_parameters(), **CODECS[codec], **extra)


_OPTIMIZERS = itertools.count()


def optimizer(model: torch.nn.Module, comp, prefix: Optional[str] = None) -> hvd.DistributedOptimizer:
    """Horovod's optimizer over ``model``, its tensors named anew for each optimizer (the same
    names on every rank: every rank builds the same optimizers in the same order). A failed step
    leaves its other tensors in Horovod's background thread for a while, and Horovod refuses a
    name it is still processing ("same name as another tensor"), whatever the next case does.
    ``prefix``: these names instead (for optimizers that must share their tensors' names)."""
    kwargs = {} if comp is None else {"compression": comp}
    prefix = f"opt{next(_OPTIMIZERS)}." if prefix is None else prefix
    named = [(prefix + name, p) for name, p in model.named_parameters()]
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named, **kwargs)


def train_step(model: torch.nn.Module, opt, step: int = 0) -> None:
    g = torch.Generator().manual_seed(100 * step + RANK)
    opt.zero_grad()
    model(torch.randn(5, 6, generator=g)).pow(2).sum().backward()
    opt.step()


@needs_peers
@pytest.mark.parametrize("pair", list(itertools.combinations(CODECS, 2)), ids="-vs-".join)
def test_different_codecs_raise_on_every_rank(pair):
    """Rank 0 builds one codec, the others another: ExchangeMismatchError everywhere at step 1."""
    model = make_model()
    comp = compression(pair[0] if RANK == 0 else pair[1], model)
    opt = optimizer(model, comp)
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        train_step(model, opt)


@needs_peers
def test_different_patterns_raise_on_every_rank():
    model = make_model()
    comp = compression("onebit", model, pattern="two_phase" if RANK == 0 else "allgather")
    opt = optimizer(model, comp)
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        train_step(model, opt)


@needs_peers
@pytest.mark.parametrize("plain", ["default", "none", "fp16"])
def test_one_rank_with_plain_horovod_fails_on_every_rank(plain):
    """Rank 0 uses Horovod's own allreduce (no compression=, or Compression.none/fp16), the others
    a codec: Horovod's coordinator sees the codec's one-element placeholders against rank 0's
    gradients (no parameter here has one element) and fails every rank's step."""
    model = make_model()
    if RANK == 0:
        comp = None if plain == "default" else getattr(hgc.Compression, plain)(model.named_parameters())
    else:
        comp = compression("onebit", model)
    opt = optimizer(model, comp)
    with pytest.raises(Exception, match="(?i)mismatch"):
        train_step(model, opt)


@needs_peers
@pytest.mark.parametrize("transport", ["mpi", "horovod"])
def test_compressions_built_in_a_different_order_train_alike(transport):
    """Two models, each with its own compression, built in a different order on rank 0: used in
    the same order, they train to the same parameters on every rank."""
    models = {"a": make_model(1), "b": make_model(2, width=5)}
    codecs = {"a": "onebit", "b": "terngrad"}
    comps = {}
    for key in (["b", "a"] if RANK == 0 else ["a", "b"]):
        comps[key] = compression(codecs[key], models[key], transport=transport)
    opts = {k: optimizer(models[k], comps[k]) for k in models}
    for step in range(3):
        for k in ("a", "b"):
            train_step(models[k], opts[k], step)
    for k in models:
        assert_identical_across_ranks(models[k])
        assert comps[k].stats()["steps"] == 3


@needs_peers
def test_compressions_used_in_a_different_order_raise_on_every_rank():
    """Rank 0 steps model b first, the others model a: the first exchange pairs a's bucket with
    b's and the preamble names it on every rank. (The models' parameter names are the same, so
    Horovod's placeholder allreduces pair up and every rank reaches the exchange.)"""
    models = {"a": make_model(1), "b": make_model(2, width=5)}
    comps = {k: compression(c, models[k]) for k, c in (("a", "onebit"), ("b", "onebit"))}
    shared = f"opt{next(_OPTIMIZERS)}."
    opts = {k: optimizer(models[k], comps[k], prefix=shared) for k in models}
    first = "b" if RANK == 0 else "a"
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        train_step(models[first], opts[first])
