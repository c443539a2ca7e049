"""Automatic minibatch-size selection (Seide et al. 2014, section 5).

The paper tries candidate minibatch sizes on an initial slice of the training data (its
first 45 minutes) and keeps the largest one that does not hurt the objective: larger
minibatches mean fewer exchanges per sample, so data parallelism pays more, as long as
convergence does not suffer.

:func:`select_minibatch_size` is the rule: it calls ``trial(size)`` for every candidate,
each trial training from the same starting point on the same slice and returning the
objective afterwards (lower is better, e.g. the loss on the slice), and keeps the
largest size whose objective is within ``tolerance`` of the best one. Diverged trials
(non-finite objective) are never chosen. :func:`slice_trial` builds such a trial for a
torch model: a fresh model, ``epochs`` passes over the slice in minibatches of the size,
with the learning rate given per sample (the paper's convention: ``lr = lr_per_sample *
size`` for a loss that is a mean over the minibatch), then the mean loss over the slice.

Under data parallelism every rank must reach the same choice: make ``trial`` return the
same value on every rank (average it over ranks, or run the selection on one rank and
broadcast the size).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional, Sequence, Tuple

import torch

__all__ = ["MinibatchChoice", "select_minibatch_size", "slice_trial"]


@dataclass(frozen=True)
class MinibatchChoice:
    """The chosen ``size`` and the evidence: ``objective`` (candidate -> objective after its
    trial, in the order tried), ``best`` (the lowest finite objective), ``allowed`` (the
    threshold a candidate had to stay under: ``best + max(tolerance * |best|,
    abs_tolerance)``)."""

    size: int
    objective: Dict[int, float] = field(default_factory=dict)
    best: float = math.nan
    allowed: float = math.nan

    def as_dict(self) -> dict:
        return {"size": self.size, "objective": {str(k): v for k, v in self.objective.items()},
                "best": self.best, "allowed": self.allowed}


def select_minibatch_size(trial: Callable[[int], float], candidates: Sequence[int], *, tolerance: float = 0.02,
                          abs_tolerance: float = 0.0) -> MinibatchChoice:
    """Run ``trial(size)`` once for each of ``candidates`` (distinct positive ints, tried in
    increasing order) and return the largest size whose objective is at most
    ``best + max(tolerance * |best|, abs_tolerance)``, with the objective of every
    candidate. Raises ValueError for bad candidates or tolerances, and when every trial
    diverged."""
    sizes = sorted(candidates)
    if not sizes or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in sizes):
        raise ValueError(f"candidates must be a non-empty list of positive ints, got {list(candidates)!r}")
    if len(set(sizes)) != len(sizes):
        raise ValueError(f"candidates repeat a size: {list(candidates)!r}")
    if not (tolerance >= 0 and abs_tolerance >= 0):
        raise ValueError(f"tolerances must be >= 0, got tolerance={tolerance!r}, abs_tolerance={abs_tolerance!r}")
    objective = {s: float(trial(s)) for s in sizes}
    finite = [v for v in objective.values() if math.isfinite(v)]
    if not finite:
        raise ValueError(f"every trial diverged (objectives {objective}); lower the learning rate")
    best = min(finite)
    allowed = best + max(tolerance * abs(best), abs_tolerance)
    size = max(s for s, v in objective.items() if math.isfinite(v) and v <= allowed)
    return MinibatchChoice(size=size, objective=objective, best=best, allowed=allowed)


def slice_trial(make_model: Callable[[], torch.nn.Module],
                make_optimizer: Callable[[Sequence[torch.nn.Parameter], float], torch.optim.Optimizer],
                loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                data: Tuple[torch.Tensor, torch.Tensor], *, lr_per_sample: float, epochs: int = 1,
                seed: int = 0, reduce: Optional[Callable[[float], float]] = None) -> Callable[[int], float]:
    """A ``trial(size) -> objective`` for :func:`select_minibatch_size`.

    Each call builds ``make_model()`` (it must return the same initial parameters each
    time, e.g. by seeding), ``make_optimizer(params, lr_per_sample * size)``, and trains
    ``epochs`` passes over ``data = (x[S, ...], y[S])`` in minibatches of ``size`` (a fixed
    shuffle per epoch from ``seed``, the same for every size; a last incomplete minibatch is
    dropped, and ``size`` may not exceed S). ``loss_fn(output, y)`` must be a mean over the
    minibatch. Returns the mean of ``loss_fn`` over the whole slice after training
    (``reduce`` applied to it, e.g. an average over ranks); NaN if training diverged."""
    x, y = data
    if x.shape[0] != y.shape[0] or x.shape[0] < 1:
        raise ValueError(f"data must be (x, y) with the same number of samples >= 1, got {x.shape[0]} and "
                         f"{y.shape[0]}")
    if not lr_per_sample > 0 or epochs < 1:
        raise ValueError(f"need lr_per_sample > 0 and epochs >= 1, got {lr_per_sample!r}, {epochs!r}")

    def trial(size: int) -> float:
        if size > x.shape[0]:
            raise ValueError(f"minibatch size {size} exceeds the slice's {x.shape[0]} samples")
        model = make_model()
        opt = make_optimizer(list(model.parameters()), lr_per_sample * size)
        gen = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(epochs):
            order = torch.randperm(x.shape[0], generator=gen)
            for i in range(x.shape[0] // size):
                idx = order[i * size:(i + 1) * size]
                opt.zero_grad()
                loss = loss_fn(model(x[idx]), y[idx])
                if not torch.isfinite(loss):
                    return math.nan
                loss.backward()
                opt.step()
        model.eval()
        with torch.no_grad():
            value = float(loss_fn(model(x), y))
        value = value if math.isfinite(value) else math.nan
        return reduce(value) if reduce is not None else value

    return trial
