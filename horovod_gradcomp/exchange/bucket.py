"""The unit of work a pattern exchanges: one bucket of gradients, what came of it, and the cache
of what a pattern derives from a bucket's shapes."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Hashable, List, Mapping, Optional

import torch

from ..state.compression_state import CompressionState


@dataclass
class Bucket:
    """One bucket of one step, as the engine hands it to a pattern.

    Fields:
        names: the tensors to exchange, in an order every rank shares.
        grads: name -> this rank's gradient (read before any result is written).
        outs: name -> a tensor to receive the result (contiguous, the gradient's shape, dtype and
            device; it may be the gradient itself), or None for a new tensor.
        state: this rank's :class:`~horovod_gradcomp.state.CompressionState` (memory, owner
            memory, step); updated in place through its methods.
        order: name -> index of the name among all parameters, sorted (stream positions).
        measured: what the bucket's non-finite check measured before the preamble
            (:class:`~horovod_gradcomp.exchange.nonfinite_check.Measured`: encode options and local scales
            the pattern reuses, whether to look at the received payloads); None: nothing (the
            pattern computes what it needs itself).
    """

    names: List[str]
    grads: Mapping[str, torch.Tensor]
    state: CompressionState
    order: Mapping[str, int]
    outs: Mapping[str, Optional[torch.Tensor]] = field(default_factory=dict)
    measured: Optional[object] = None

    @property
    def check_payloads(self) -> bool:
        """True when the pattern must look for non-finite input in the payloads it receives."""
        return self.measured is not None and self.measured.check_payloads


@dataclass
class BucketOutcome:
    """Fields:
        results: name -> the mean over ranks of the decoded payloads (bitwise the same on every rank).
        payload: bytes this rank encoded.
        sent: wire bytes this rank sent (data collectives and shared scales).
        info: pattern-specific details (the two-phase pattern's per-phase bytes).
        nonfinite: a received payload showed non-finite input (only where the bucket's
            ``check_payloads``); the same on every rank: the engine skips the step.
    """

    results: Dict[str, torch.Tensor]
    payload: int
    sent: float
    info: dict = field(default_factory=dict)
    nonfinite: bool = False


def result_tensor(grad: torch.Tensor, out: Optional[torch.Tensor]) -> torch.Tensor:
    """``out`` when it can hold the result as is, else a new tensor like ``grad``."""
    if (out is not None and out.shape == grad.shape and out.dtype == grad.dtype
            and out.device == grad.device and out.is_contiguous()):
        return out
    return torch.empty(grad.shape, dtype=grad.dtype, device=grad.device)


class BoundedCache(dict):
    """Plans and layouts by bucket shapes, which rarely change: emptied when ``limit`` entries are
    reached, so that it never grows without bound."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def get_or_make(self, key: Hashable, make: Callable[[], object]):
        """The value cached for ``key``, ``make()`` (and cached) when there is none."""
        value = self.get(key)
        if value is None:
            if len(self) >= self.limit:
                self.clear()
            value = self[key] = make()
        return value
