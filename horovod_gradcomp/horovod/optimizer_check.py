"""Check the optimizer that applies a compressor-owned momentum's updates (DGC).

DGC keeps the momentum inside the compressor, so the optimizer Horovod wraps must be plain
SGD: ``torch.optim.SGD`` with ``momentum=0`` (and so no Nesterov). A second momentum on top
would silently change the algorithm, so this module raises instead.

The compression object never sees the optimizer (``hvd.DistributedOptimizer`` only calls
``compress``/``decompress``), so the check hangs on torch's global optimizer step pre-hook:
before the first ``step()`` of any optimizer holding one of the compressed parameters, its
param groups are inspected. Every rank runs the same ``step()``, so every rank raises the
same error. What cannot be detected: an optimizer whose step is never called through
``torch.optim.Optimizer`` (a hand-written update loop); such a loop must itself apply
``w <- w - lr * grad``.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Iterable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


class OptimizerMismatchError(ValueError):
    """The wrapped optimizer would apply a second momentum (or is not SGD)."""


def check_plain_sgd(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], owner: str) -> None:
    """Raise :class:`OptimizerMismatchError` unless every param group of ``optimizer`` that
    holds one of ``params`` is SGD with momentum 0; warn about weight decay (it is then
    applied after the exchange, outside the compressor's momentum)."""
    ours = {id(p) for p in params}
    groups = [g for g in optimizer.param_groups if any(id(p) in ours for p in g["params"])]
    if not groups:
        return
    if not isinstance(optimizer, torch.optim.SGD):
        raise OptimizerMismatchError(
            f"{owner} keeps the momentum itself, so the optimizer must be torch.optim.SGD with momentum=0; got "
            f"{type(optimizer).__name__}. "
            "Pass check_optimizer=False to combine DGC with another optimizer knowingly.")
    for g in groups:
        if g.get("momentum", 0) != 0 or g.get("nesterov", False):
            raise OptimizerMismatchError(
                f"{owner} keeps the momentum itself (its momentum= option): the wrapped torch.optim.SGD must have "
                f"momentum=0, got momentum={g.get('momentum')} nesterov={g.get('nesterov')}. Move the momentum to "
                f"the compression: torch.optim.SGD(params, lr=..., momentum=0) and hgc.Compression.dgc(..., "
                f"momentum={g.get('momentum')}).")
        if g.get("weight_decay", 0) != 0:
            warnings.warn(f"{owner}: the wrapped SGD's weight_decay={g['weight_decay']} is applied after the exchange, "
                          "outside DGC's momentum (torch's momentum SGD puts it inside). Prefer adding the decay to "
                          "the loss if the momentum should carry it.", stacklevel=3)


class PlainSGDGuard:
    """Runs :func:`check_plain_sgd` once per optimizer, before its first ``step()``."""

    def __init__(self, params: Iterable[torch.Tensor], owner: str):
        self._params = [p for p in params]
        self._owner = owner
        self._checked = weakref.WeakSet()
        # The global hook must not keep the guard (and its compression) alive.
        guard = weakref.ref(self)

        def hook(optimizer, args, kwargs):
            me = guard()
            if me is not None:
                me.check(optimizer)
            return None

        self._handle = register_optimizer_step_pre_hook(hook)
        weakref.finalize(self, self._handle.remove)

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer not in self._checked:
            check_plain_sgd(optimizer, self._params, self._owner)
            self._checked.add(optimizer)

    def remove(self) -> None:
        self._handle.remove()
