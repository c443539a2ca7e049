"""Where each encode draws its random numbers: one stream position per (step, tensor, stripe, phase).

A stochastic codec is reset to a position before every encode, so its random numbers depend on
(step, tensor, stripe, phase) and never on the order in which hooks fire:

    position = ((step * P + i) * S + s) * F + f

with P the number of parameters, i the tensor's index in the sorted names, S stripes per
tensor and F encodes per stripe. The allgather pattern encodes each tensor once (S = F = 1:
``step * P + i``); the two-phase pattern cuts each tensor into S = K stripes, encoded by
their worker (f = 0) and requantized by their owner (f = 1).
"""
from __future__ import annotations

from typing import Mapping


def stream_position(step: int, num_params: int, index: int, stripes: int = 1, stripe: int = 0,
                    phases: int = 1, phase: int = 0) -> int:
    """``((step * num_params + index) * stripes + stripe) * phases + phase`` (see the module doc)."""
    return ((step * num_params + index) * stripes + stripe) * phases + phase


class StepPositions:
    """``positions(name, stripe=0, phase=0)``: :func:`stream_position` of one step's encodes.

    Fields: step, order (name -> index i, the sorted names), stripes (S), phases (F)."""

    def __init__(self, step: int, order: Mapping[str, int], stripes: int = 1, phases: int = 1):
        self.step, self.order, self.stripes, self.phases = step, order, stripes, phases

    def __call__(self, name: str, stripe: int = 0, phase: int = 0) -> int:
        return stream_position(self.step, len(self.order), self.order[name], self.stripes, stripe, self.phases, phase)


__all__ = ["StepPositions", "stream_position"]
