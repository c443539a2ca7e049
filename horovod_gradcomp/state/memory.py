"""The worker-memory seam: what the exchange asks of the state that turns a gradient into a payload.

Two memories implement it: error feedback (:class:`~horovod_gradcomp.state.error_feedback.ErrorFeedback`,
a residual per name) and DGC's momentum and accumulation
(:class:`~horovod_gradcomp.state.dgc_memory.DGCMemory`). The exchange, the hooks and the
compression objects call a memory only through :class:`Memory`: its declared properties say what
a memory can do (keep residuals, back the two-phase pattern's stripes, clip the step), so that no
caller has to ask which class it holds.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Dict, List, Mapping, Optional, Sequence

import torch

from ..codecs.base import Codec, Payload


class Memory(ABC):
    """A rank's per-name memory between steps (see the module doc).

    Subclasses implement the abstract methods and set the class attributes below; the methods
    with a body are the defaults of a memory that has nothing to do there.
    """

    #: Whether the memory changes what is encoded at all (error feedback turned off: False).
    enabled: bool = True
    #: True when :meth:`compensated`, :meth:`residual` and :meth:`peek` are available: the memory
    #: keeps an error-feedback residual per name, of the gradient's shape, and encodes
    #: ``gradient + residual`` (the non-finite check and the shared-scale agreement read them).
    keeps_residuals: bool = False
    #: True when the two-phase pattern may use this memory: it encodes ``gradient + residual``
    #: with a residual that stripes can take views of (:meth:`residual`), and the owners'
    #: requantization gets an error-feedback memory of its own.
    supports_owner_stripes: bool = False
    #: True when what the codec encodes is the memory's own state rather than the gradient plus
    #: a residual (DGC's accumulated velocity): the codec's own non-finite checks of its input do
    #: not apply then, and the step's check is :attr:`step_nonfinite` (with clipping) or a read
    #: of the gradients.
    encodes_own_state: bool = False
    #: The clipping threshold of the reduced gradient (DGC's local clipping), None: no clipping.
    clip_norm: Optional[float] = None
    #: True when this step's :meth:`begin_step` found a NaN or Inf in the gradients' norm
    #: (a memory that clips reads every gradient first anyway); False otherwise.
    step_nonfinite: bool = False

    @property
    def needs_all_grads(self) -> bool:
        """True when :meth:`encode` needs :meth:`begin_step` with every gradient of the step first
        (global clipping): the exchange then encodes at the flush instead of in the hooks."""
        return False

    @abstractmethod
    def agreement_key(self) -> str:
        """What every rank's memory must agree on before an exchange."""

    def begin_step(self, grads: Mapping[str, torch.Tensor], world_size: int) -> None:
        """Prepare a step from all of this rank's gradients (only called where
        :attr:`needs_all_grads`); nothing to prepare by default."""

    def end_step(self) -> None:
        """Close one exchange (advance the memory's own clock); nothing to advance by default."""

    # -- encoding --------------------------------------------------------------------------
    @abstractmethod
    def encode(self, codec: Codec, name: str, grad: torch.Tensor, **encode_options) -> Payload:
        """``grad`` folded into ``name``'s memory and encoded by ``codec``; the memory updated."""

    @abstractmethod
    def encode_many(self, codec: Codec, names: Sequence[str], grads: Sequence[torch.Tensor],
                    options: Optional[Sequence[dict]] = None,
                    positions: Optional[Sequence[int]] = None) -> List[Payload]:
        """:meth:`encode` of each of a bucket's names, tensor i from stream position
        ``positions[i]`` (None: the codec's current one), with ``options[i]`` (None: none):
        the same payloads and memory as the per-tensor calls, in one bucket op where the codec
        has one."""

    # -- error-feedback residuals (where keeps_residuals) -------------------------------------
    def compensated(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """``grad`` plus ``name``'s residual: the values :meth:`encode` would encode. Only where
        :attr:`keeps_residuals`."""
        raise TypeError(f"{self!r} keeps no error-feedback residuals: it has no compensated gradient")

    def residual(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """``name``'s residual (contiguous, shaped like ``like``; zeros on first use). Only where
        :attr:`keeps_residuals`."""
        raise TypeError(f"{self!r} keeps no error-feedback residuals")

    def peek(self, name: str, like: torch.Tensor) -> Optional[torch.Tensor]:
        """``name``'s residual when one exists, else None; creates nothing. Only where
        :attr:`keeps_residuals`."""
        raise TypeError(f"{self!r} keeps no error-feedback residuals")

    # -- options and clock ---------------------------------------------------------------
    def set_reduction(self, reduction: str) -> None:
        """How the ranks' gradients are combined, "mean" or "sum" (the wrapped optimizer's op),
        for a memory whose options refer to it (DGC's clipping threshold); ignored by default."""
        if reduction not in ("mean", "sum"):
            raise ValueError(f"memory: reduction must be 'mean' or 'sum', got {reduction!r}")

    def set_option(self, name: str, value) -> None:
        """A codec option set after construction, for a memory that keeps a copy of it (DGC's
        density schedule); ignored by default."""

    def set_epoch(self, epoch: int) -> None:
        """The training epoch, for a memory with a schedule by epoch (DGC's warm-up); checked
        and ignored by default."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"set_epoch expects an int >= 0, got {epoch!r}")

    def stores(self) -> Dict[str, Dict[str, torch.Tensor]]:
        """The memory's tensors between steps, by store name (``"residuals"``; DGC's
        ``"velocities"`` and ``"accumulations"``), each name -> tensor: what its size and its
        sharded checkpoint are made of. None by default."""
        return {}

    def set_mean_of(self, ranks: int) -> None:
        """The values this memory encodes are means of ``ranks`` ranks' gradients (the
        hierarchical exchange's node means); a memory whose encodes depend on that (DGC's
        default density) adapts, others ignore it."""

    def clock(self) -> Dict[str, int]:
        """The memory's own counters that every rank must share (an elastic restart broadcasts
        them from rank 0); none by default."""
        return {}

    def set_clock(self, clock: Mapping[str, int]) -> None:
        """Set the counters :meth:`clock` returned (every key of it given)."""
        if set(clock) != set(self.clock()):
            raise ValueError(f"{self!r}: the clock has keys {sorted(self.clock())}, got {sorted(clock)}")

    # -- a skipped step and checkpoints ---------------------------------------------------
    @abstractmethod
    def snapshot(self, names) -> dict:
        """Copies of what an exchange of ``names`` may change, for :meth:`restore`."""

    @abstractmethod
    def restore(self, snapshot: dict) -> None:
        """Put back what :meth:`snapshot` copied (in place, so views stay valid)."""

    @abstractmethod
    def state_dict(self) -> dict:
        """Copies of the memory's state (tensors cloned: the live state is updated in place)."""

    @abstractmethod
    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (tensors copied: the checkpoint is not aliased)."""
