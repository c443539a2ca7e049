"""The opt-in learning-rate warm-up carried by the gradient: averaged gradients scaled up linearly.

A codec with ``lr_warmup_steps = N > 0`` (onebit's option, 0 by default; its old name was
``ramp_steps``) has the results of step ``t`` (the compression's own step counter, from 0)
multiplied by ``(t + 1) / N`` while ``t < N``, and left alone from step ``N - 1`` on. For SGD
(with or without momentum) this is a linear learning-rate warm-up over N steps, the remedy Goyal
et al. and Deep Gradient Compression pair with aggressive compression in the first steps;
optimizers that normalize the gradient (Adam, Adagrad) hardly notice it. Because it acts on the
gradient, everything the user's code does with the gradient after the exchange (clipping, norm
logging, a GradScaler, its own warm-up) sees the scaled gradient: that is why it is off unless
asked for. Only the results are scaled: the payloads, the residuals and every byte on the wire
are those of the unscaled step, so the error feedback is untouched
(docs/results/onebit_divergence.md).

Every rank computes the same factor from the same step and multiplies bitwise the same results,
so the results stay bitwise the same on every rank.
"""
from __future__ import annotations

from typing import Iterable

import torch


def ramp_factor(ramp_steps: int, step: int) -> float:
    """The factor of step ``step`` (0-based) under a warm-up of ``ramp_steps`` steps: ``(step + 1) /
    ramp_steps`` before its end, 1.0 after it and without one (``ramp_steps`` 0)."""
    if ramp_steps <= 0 or step + 1 >= ramp_steps:
        return 1.0
    return (step + 1) / ramp_steps


def apply_ramp(results: Iterable[torch.Tensor], factor: float) -> None:
    """Multiply each of ``results`` in place by ``factor`` (nothing for 1.0)."""
    if factor == 1.0:
        return
    for t in results:
        t.mul_(factor)


__all__ = ["apply_ramp", "ramp_factor"]
