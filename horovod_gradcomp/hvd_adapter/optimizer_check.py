"""Check the optimizer that applies a compressor-owned momentum's updates (DGC).

DGC keeps the momentum inside the compressor (its momentum correction is SGD's momentum, moved
before the sparsification). So:

* with ``torch.optim.SGD``, the optimizer must run with ``momentum=0`` (and so no Nesterov): a
  second momentum on top would silently change the algorithm, so this module raises instead
  (or, with ``Compression.dgc(momentum=None)``, the default, takes the SGD's momentum over);
* with any other optimizer (Adam, AdamW, ...), DGC runs without its momentum correction
  (momentum 0: gradients accumulate until their top-k values are sent, nothing more) and the
  optimizer applies its own moments to the exchanged gradient. ``momentum=None`` (the default)
  then takes momentum 0, with one warning per process saying so; an explicit ``momentum > 0`` is
  refused (it would be SGD momentum under another optimizer's moments).

The compression object never sees the optimizer (``hvd.DistributedOptimizer`` only calls
``compress``/``decompress``), so the check hangs on torch's global optimizer step pre-hook:
before the first ``step()`` of any optimizer holding one of the compressed parameters, its
param groups are inspected. Every rank runs the same ``step()``, so every rank raises the
same error. What cannot be detected: an optimizer whose step is never called through
``torch.optim.Optimizer`` (a hand-written update loop); such a loop must itself apply
``w <- w - lr * grad``.
"""
from __future__ import annotations

import logging
import warnings
import weakref
from typing import Iterable

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook


class OptimizerMismatchError(ValueError):
    """The wrapped optimizer would apply a second momentum (or is not SGD)."""


_warned_without_momentum = False


def _warn_without_momentum(owner: str, optimizer: torch.optim.Optimizer) -> None:
    """Once per process: DGC runs without its momentum correction under a non-SGD optimizer."""
    global _warned_without_momentum
    if not _warned_without_momentum:
        _warned_without_momentum = True
        warnings.warn(f"{owner}: the optimizer is {type(optimizer).__name__}, not SGD: DGC runs without its "
                      "(SGD) momentum correction (momentum 0: gradients accumulate until their top-k values are "
                      f"sent); {type(optimizer).__name__} applies its own moments to the exchanged gradient",
                      UserWarning, stacklevel=4)


def check_plain_sgd(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], owner: str,
                    momentum: float = 0.0) -> None:
    """Raise :class:`OptimizerMismatchError` unless every param group of ``optimizer`` that
    holds one of ``params`` is SGD with momentum 0, or the optimizer is not SGD and the
    compression's own ``momentum`` is 0 (DGC without its momentum correction, e.g. under Adam);
    warn about SGD's weight decay (it is then applied after the exchange, outside the
    compressor's momentum)."""
    ours = {id(p) for p in params}
    groups = [g for g in optimizer.param_groups if any(id(p) in ours for p in g["params"])]
    if not groups:
        return
    if not isinstance(optimizer, torch.optim.SGD):
        if momentum == 0:
            return
        raise OptimizerMismatchError(
            f"{owner}: momentum={momentum} is SGD's momentum, kept in the compression; the optimizer is "
            f"{type(optimizer).__name__}, which applies its own moments. Leave momentum unset (DGC then runs "
            "without its momentum correction under this optimizer) or pass momentum=0; or pass "
            "check_optimizer=False to combine them knowingly.")
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


def take_momentum(optimizer: torch.optim.Optimizer, params: Iterable[torch.Tensor], owner: str):
    """``(momentum, nesterov)`` of the SGD groups holding ``params``, which are then set to
    momentum 0 (the compression applies the momentum instead); ``(0.0, False)`` with one warning
    per process when the optimizer is not SGD (Adam, AdamW: DGC without its momentum correction).
    Raises :class:`OptimizerMismatchError` when the SGD's groups disagree; ``None`` when the
    optimizer holds none of ``params``."""
    ours = {id(p) for p in params}
    groups = [g for g in optimizer.param_groups if any(id(p) in ours for p in g["params"])]
    if not groups:
        return None
    if not isinstance(optimizer, torch.optim.SGD):
        _warn_without_momentum(owner, optimizer)
        return 0.0, False
    found = {(float(g.get("momentum", 0.0)), bool(g.get("nesterov", False))) for g in groups}
    if len(found) > 1:
        raise OptimizerMismatchError(f"{owner}: the SGD param groups holding the compressed parameters have different "
                                     f"momentum settings {sorted(found)}; pass momentum= explicitly")
    momentum, nesterov = found.pop()
    for g in groups:
        g["momentum"], g["nesterov"] = 0.0, False
    if momentum:
        logging.getLogger("horovod_gradcomp").warning(
            "%s: took momentum=%s nesterov=%s from the wrapped SGD, which now runs with momentum 0 (DGC's momentum "
            "correction applies it)", owner, momentum, nesterov)
    return momentum, nesterov


#: Hook handles of guards that were garbage-collected, removed at the next guard's creation.
#: A collection can run anywhere, also inside ``Optimizer.step()`` while torch iterates over the
#: global pre-hooks (a hook allocates; another thread collects): removing the hook right there
#: raised "OrderedDict mutated during iteration". A dead guard's hook does nothing meanwhile.
_dead_handles: list = []


def _remove_dead_hooks() -> None:
    while _dead_handles:
        _dead_handles.pop().remove()


def watch_optimizer_steps(guard):
    """Call ``guard.check(optimizer)`` before every optimizer's ``step()`` while ``guard`` lives:
    a global step pre-hook that holds the guard weakly (it must not keep the guard, or its
    compression, alive); once the guard is collected its hook does nothing and is removed at the
    next registration (see ``_dead_handles``). Returns the hook's handle."""
    _remove_dead_hooks()
    ref = weakref.ref(guard)

    def hook(optimizer, args, kwargs):
        me = ref()
        if me is not None:
            me.check(optimizer)
        return None

    handle = register_optimizer_step_pre_hook(hook)
    weakref.finalize(guard, _dead_handles.append, handle)
    return handle


class PlainSGDGuard:
    """Before the first ``step()`` of each optimizer holding the compressed parameters: hand
    its momentum to ``adopt_momentum(momentum, nesterov)`` when given (:func:`take_momentum`),
    else run :func:`check_plain_sgd` against the compression's own ``momentum``."""

    def __init__(self, params: Iterable[torch.Tensor], owner: str, adopt_momentum=None, momentum: float = 0.0):
        self._params = [p for p in params]
        self._owner = owner
        self._adopt = adopt_momentum
        self._momentum = momentum
        self._checked = weakref.WeakSet()
        self._handle = watch_optimizer_steps(self)

    def check(self, optimizer: torch.optim.Optimizer) -> None:
        if optimizer in self._checked:
            return
        if self._adopt is None:
            check_plain_sgd(optimizer, self._params, self._owner, self._momentum)
        else:
            taken = take_momentum(optimizer, self._params, self._owner)
            if taken is not None:
                self._adopt(*taken)
        self._checked.add(optimizer)

    def remove(self) -> None:
        self._handle.remove()
