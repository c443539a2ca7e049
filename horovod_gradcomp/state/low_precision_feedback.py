"""Error feedback whose residuals are stored in a lower precision (bf16 or fp16).

Sharded FSDP2 keeps, on every rank, a residual as large as the unsharded gradient (each rank
remembers what it failed to send of every chunk, see :mod:`horovod_gradcomp.fsdp.register`).
:class:`LowPrecisionErrorFeedback` stores it in ``dtype`` (half the bytes of fp32 for bf16): the
step is still computed in the gradient's dtype,

``v = g + r (promoted to g's dtype);  payload = encode(v);  r <- round_dtype(v - decode(payload))``,

so the only change is that the residual carried to the next step is rounded to ``dtype`` (bf16
keeps 8 bits of mantissa: about 0.4% relative error on what is carried over, never on what is
sent this step). Each tensor's step goes through
:func:`~horovod_gradcomp.state.error_feedback.encode_with_residual` on a copy of its residual in
the gradient's dtype (a codec's fused feedback, and so its own rules such as onebit's
``residual_cap``, apply as with fp32 residuals), tensor by tensor; the copy is then rounded into
the stored residual.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from ..codecs.base import Codec, Payload
from .error_feedback import ErrorFeedback, encode_each, encode_with_residual

#: The dtypes a residual may be stored in (float32 is the default ErrorFeedback).
LOW_PRECISION = (torch.bfloat16, torch.float16)


class LowPrecisionErrorFeedback(ErrorFeedback):
    """:class:`ErrorFeedback` with residuals stored in ``dtype`` (``torch.bfloat16`` or
    ``torch.float16``). Fields: as ErrorFeedback's, plus dtype."""

    #: The two-phase owner stripes are views in the gradient's dtype: not offered here.
    supports_owner_stripes = False

    def __init__(self, dtype: torch.dtype = torch.bfloat16, enabled: bool = True):
        if dtype not in LOW_PRECISION:
            raise ValueError(f"LowPrecisionErrorFeedback: residual dtype must be one of "
                             f"{[str(d) for d in LOW_PRECISION]}, got {dtype!r} (float32 is plain ErrorFeedback)")
        super().__init__(enabled=enabled)
        self.dtype = dtype

    def agreement_key(self) -> str:
        return f"error_feedback={self.enabled},residual_dtype={self.dtype}"

    def residual(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The residual of ``name`` in :attr:`dtype`, shaped and placed like ``like`` (zeros at first)."""
        r = self.residuals.get(name)
        if r is None:
            r = self.residuals[name] = torch.zeros(like.shape, dtype=self.dtype, device=like.device)
        elif r.shape != like.shape or r.dtype != self.dtype or r.device != like.device:
            raise ValueError(
                f"error feedback ({self.dtype}): gradient of {name!r} is {tuple(like.shape)}/{like.device} but its "
                f"residual is {tuple(r.shape)}/{r.dtype}/{r.device}; was a checkpoint for another model loaded?")
        return r

    def compensated(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        return grad + self.residual(name, grad).to(grad.dtype) if self.enabled else grad

    def encode(self, codec: Codec, name: str, grad: torch.Tensor, **encode_options) -> Payload:
        """Encode ``grad`` plus the residual (in ``grad``'s dtype); store the new residual rounded to
        :attr:`dtype`."""
        if not self.enabled:
            return codec.encode(grad, **encode_options)
        r = self.residual(name, grad)
        # the step in the gradient's dtype through the package's one error-feedback encode, so that a
        # codec's own feedback rules (onebit's residual_cap) hold here too; then rounded to self.dtype
        wide = r.to(grad.dtype, copy=True)
        payload = encode_with_residual(codec, grad, wide, **encode_options)
        r.copy_(wide)
        return payload

    def encode_many(self, codec: Codec, names: Sequence[str], grads: Sequence[torch.Tensor],
                    options: Optional[Sequence[dict]] = None, positions: Optional[Sequence[int]] = None) -> List[Payload]:
        """:meth:`encode` of each name, tensor by tensor (no bucket op: see the module doc)."""
        return encode_each(self, codec, names, grads, options, positions)

    def __repr__(self) -> str:
        return f"ErrorFeedback(enabled={self.enabled}, residual_dtype={self.dtype})"
