"""Error-feedback memory: one residual per key (parameter name, or a two-phase stripe key).

Seide et al., 2014:

``v = g + r;  payload = encode(v);  r <- v - decode(payload)``. Codecs that fuse the
update (``codec.fuses_feedback``) receive the residual and update it in the same pass;
for the others the memory does it with plain torch ops.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from ..codecs.base import Codec, Payload
from .memory import Memory


def encode_with_residual(codec: Codec, tensor: torch.Tensor, residual: Optional[torch.Tensor],
                         **encode_options) -> Payload:
    """The one error-feedback encode of the package: ``v = tensor + residual``, encode ``v``,
    ``residual <- v - decode(payload)`` in place (by the codec itself when it
    ``fuses_feedback``). ``residual=None``: encode ``tensor`` alone. Used for whole tensors
    (:meth:`ErrorFeedback.encode`) and for two-phase stripes (views into a residual)."""
    if residual is None:
        return codec.encode(tensor, **encode_options)
    if codec.fuses_feedback:
        return codec.encode(tensor, residual=residual, **encode_options)
    v = tensor + residual
    payload = codec.encode(v, **encode_options)
    residual.copy_(v - codec.decode(payload))
    return payload


def encode_each(memory, codec: Codec, names: Sequence[str], grads: Sequence[torch.Tensor],
                options: Optional[Sequence[dict]] = None, positions: Optional[Sequence[int]] = None) -> List[Payload]:
    """``memory.encode(codec, names[i], grads[i], **options[i])`` in order, tensor i from stream
    position ``positions[i]`` (None: the codec's current one): a memory's tensor-by-tensor
    :meth:`encode_many`."""
    payloads = []
    for i, (name, grad) in enumerate(zip(names, grads)):
        if positions is not None:
            codec.reset_stream(positions[i])
        payloads.append(memory.encode(codec, name, grad, **(options[i] if options is not None else {})))
    return payloads


class ErrorFeedback(Memory):
    """Residuals keyed by parameter name (a :class:`~horovod_gradcomp.state.memory.Memory`).

    Fields:
        residuals: name -> tensor of the parameter's shape and gradient dtype, created as
            zeros the first time the name is encoded.
        enabled: when False, :meth:`encode` encodes the gradient alone and keeps nothing.
    """

    #: Two-phase stripes take views of the residuals; the owners get an error feedback of their own.
    supports_owner_stripes = True

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.residuals: Dict[str, torch.Tensor] = {}

    @property
    def keeps_residuals(self) -> bool:
        """True while enabled: the residuals exist and are what :meth:`encode` adds."""
        return self.enabled

    def agreement_key(self) -> str:
        """What every rank's memory must agree on."""
        return f"error_feedback={self.enabled}"

    def stores(self) -> Dict[str, Dict[str, torch.Tensor]]:
        return {"residuals": self.residuals}

    def residual(self, name: str, like: torch.Tensor) -> torch.Tensor:
        """The residual of ``name`` (always contiguous: two-phase stripes are views into it);
        zeros shaped like ``like`` on first use."""
        r = self.residuals.get(name)
        if r is None:
            r = self.residuals[name] = torch.zeros_like(like, memory_format=torch.contiguous_format)
        elif r.shape != like.shape or r.dtype != like.dtype or r.device != like.device:
            raise ValueError(
                f"error feedback: gradient of {name!r} is {tuple(like.shape)}/{like.dtype}/{like.device} but its "
                f"residual is {tuple(r.shape)}/{r.dtype}/{r.device}; was a checkpoint for another model loaded?")
        return r

    def peek(self, name: str, like: torch.Tensor) -> Optional[torch.Tensor]:
        """The residual of ``name`` when it exists (checked as :meth:`residual` checks it), else
        None: creates nothing (the non-finite check reads residuals before any state is written)."""
        return self.residual(name, like) if name in self.residuals else None

    def compensated(self, name: str, grad: torch.Tensor) -> torch.Tensor:
        """``grad + r`` (just ``grad`` when disabled); the residual is not changed."""
        return grad + self.residual(name, grad) if self.enabled else grad

    def encode(self, codec: Codec, name: str, grad: torch.Tensor, **encode_options) -> Payload:
        """Encode ``grad`` plus the residual of ``name`` and update the residual.
        ``encode_options`` go to ``codec.encode`` (e.g. a shared ``scale``)."""
        return encode_with_residual(codec, grad, self.residual(name, grad) if self.enabled else None,
                                    **encode_options)

    def encode_many(self, codec: Codec, names: Sequence[str], grads: Sequence[torch.Tensor],
                    options: Optional[Sequence[dict]] = None, positions: Optional[Sequence[int]] = None) -> List[Payload]:
        """:meth:`encode` of each of a bucket's names, tensor i from stream position ``positions[i]``:
        in one bucket op of the codec (:meth:`~horovod_gradcomp.codecs.base.Codec.bucket_ops`) when
        it has one for these tensors and needs no feedback step of its own (it fuses the update, or
        feedback is off), else tensor by tensor. The same payloads and residuals either way."""
        if codec.bucket_ops([g.device for g in grads]) and (codec.fuses_feedback or not self.enabled):
            residuals = [self.residual(n, g) for n, g in zip(names, grads)] if self.enabled else None
            return codec.encode_many(grads, residuals, options, positions)
        return encode_each(self, codec, names, grads, options, positions)

    def snapshot(self, names) -> dict:
        """Copies of the residuals of ``names`` (None where there is none yet), for :meth:`restore`."""
        return {n: (self.residuals[n].clone() if n in self.residuals else None) for n in names}

    def restore(self, snapshot: dict) -> None:
        """Put back what :meth:`snapshot` copied (in place, so views stay valid)."""
        for n, saved in snapshot.items():
            if saved is None:
                self.residuals.pop(n, None)
            else:
                self.residuals[n].copy_(saved)

    def __repr__(self) -> str:
        return f"ErrorFeedback(enabled={self.enabled})"

    def state_dict(self) -> Dict[str, object]:
        return {"enabled": self.enabled, "residuals": {k: v.detach().clone() for k, v in self.residuals.items()}}

    def load_state_dict(self, state: Dict[str, object], device: Optional[torch.device] = None) -> None:
        self.enabled = bool(state["enabled"])
        # Always copies: the residuals are updated in place and must not alias the checkpoint.
        self.residuals = {k: v.to(device if device is not None else v.device, copy=True,
                                  memory_format=torch.contiguous_format)
                          for k, v in dict(state["residuals"]).items()}
