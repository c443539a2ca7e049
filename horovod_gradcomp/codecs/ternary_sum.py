"""The exact sum of K TernGrad payloads that share one scale: the two-phase owner's payload.

TernGrad's K payloads of one stripe carry ``s * v_k`` with one scale ``s`` (agreed by the
MAX-allreduce) and ``v_k`` in {-1, 0, +1}, so their sum is ``s`` times an integer in [-K, K]
(TernGrad, docs/guide/codecs/terngrad.md). The owner sends that integer instead of ternarizing the mean again:
nothing is lost, so the two-phase pattern keeps TernGrad's accuracy (a second ternarization
tripled a character model's perplexity), and it still sends fewer bytes than the allgather from
K = 4 on (per rank and value, (K-1)/K * (2 + w) bits against 2 (K-1)).

Wire format (``Payload.buffers``, in this order):

* ``levels``: the biased sums ``sum_k v_k + K``, unsigned, ``w`` bits each, little-endian and
  LSB first: ``w = 4`` for K <= 7 (two per byte, element 2j in the low nibble of byte j), 8 for
  K <= 127, 16 for K <= 32767; ``ceil(n * w / 8)`` bytes;
* ``scale``: float32[1], ``s``.

Decoding gives the mean, ``(sum_k v_k) * (s * (1/K))`` in float32 (float64 for fp64), the
same arithmetic as :meth:`TernGradCodec.decode_mean_stacked` of the K payloads themselves.

Implementations: ``impl="native"`` runs two kernel passes (``terngrad_sum_levels``: the K code
rows to the packed fields; ``terngrad_sum_decode``), the CPU kernels on CPU tensors and the
device kernels on CUDA tensors; ``impl="twin"`` the device kernels built for the CPU
(``_C_twin``); the reference uses torch ops. All give the same bytes and values.
"""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch

from ..native import kernels_for, require_native_device
from .base import BufferSpec, Codec, Payload
from .dtypes import accumulation_dtype
from .payload_checks import check_fixed

#: Largest K whose biased sums (0..2K) fit 16 bits: the widest field here, and the limit of
#: TernGrad's integer decode-sum path (its native lanes are the same 16 bits).
MAX_K = 32767


def level_width(k: int) -> int:
    """Bits per biased sum for K ranks: 4, 8 or 16 (the narrowest holding 0..2K)."""
    if not 1 <= k <= MAX_K:
        raise ValueError(f"terngrad sum: K must be in [1, {MAX_K}], got {k}")
    return 4 if 2 * k < 16 else 8 if 2 * k < 256 else 16


class TernarySumCodec(Codec):
    """The owner's payload in TernGrad's two-phase exchange (see the module doc). Built from the
    K stacked phase-1 payloads by :meth:`encode_stacked`; :meth:`decode` gives their mean."""

    name = "terngrad-sum"

    def __init__(self, k: int, impl: str = "native"):
        super().__init__(impl)
        self.k = int(k)
        self.width = level_width(self.k)
        if impl != "reference":
            self._C = kernels_for(impl, "terngrad sum")

    def _native_on(self, device: torch.device) -> bool:
        """True when this codec's kernels take the tensors (raises for CUDA tensors that the
        native extension cannot take)."""
        if self.impl == "native":
            require_native_device(device, "terngrad sum")
        return self.uses_kernels

    def __repr__(self) -> str:
        return f"TernarySumCodec(k={self.k}, impl={self.impl!r})"

    def layout(self, shape: Sequence[int], dtype: torch.dtype) -> List[BufferSpec]:
        n = math.prod(shape)
        return [("levels", torch.uint8, (n * self.width + 7) // 8), ("scale", torch.float32, 1)]

    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Payload:
        raise NotImplementedError("terngrad sum: built from K TernGrad payloads (encode_stacked), not from a tensor")

    def encode_stacked(self, ternary, stacked: Payload) -> Payload:
        """The exact sum of the K stacked TernGrad payloads (``ternary``: the TernGradCodec that
        made them). Their scales must be equal (one shared scale per stripe); a mismatch
        raises ValueError rather than sending a wrong sum."""
        k = check_fixed(ternary, stacked, stacked=True)
        if k != self.k:
            raise ValueError(f"terngrad sum: {k} payloads for a sum over K={self.k}")
        scales = stacked.buffers["scale"][:, 0]
        if not bool((scales == scales[0]).all()):
            raise ValueError(f"terngrad sum: the {k} payloads have different scales {scales.tolist()}; "
                             "the two-phase exchange agrees one scale per stripe before encoding")
        n = stacked.numel
        if self._native_on(stacked.device):
            levels = self._C.terngrad_sum_levels(stacked.buffers["codes"], n, self.width)
        else:
            ones = torch.ones_like(stacked.buffers["scale"])
            # sum_k v_k as exact small integers (K values in {-1, 0, 1} with scales of 1)
            sums = ternary.decode_mean_stacked(Payload({"codes": stacked.buffers["codes"], "scale": ones},
                                                       torch.Size([n]), torch.float32, stacked.device), 1.0)
            levels = self._pack(sums.to(torch.int32).add_(self.k))
        return Payload({"levels": levels, "scale": stacked.buffers["scale"][0].clone()},
                       stacked.shape, stacked.dtype, stacked.device)

    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The mean ``(sum_k v_k) * (s * (1/K))`` of the payload's shape and dtype (into ``out``
        when given)."""
        check_fixed(self, payload)
        n = payload.numel
        mult = payload.buffers["scale"][0].item() * (1.0 / self.k)
        flat_out = self.flat_out(out, payload)
        if self._native_on(payload.device):
            flat = self._C.terngrad_sum_decode(payload.buffers["levels"].contiguous(), n, self.k, self.width, mult,
                                               payload.dtype, flat_out)
            return flat.view(payload.shape) if out is None else out
        acc = accumulation_dtype(payload.dtype)
        mean = self._unpack(payload.buffers["levels"], n).to(acc).sub_(self.k).mul_(mult).to(payload.dtype)
        if flat_out is None:
            return mean.view(payload.shape)
        flat_out.copy_(mean)
        return out

    # -- fields ---------------------------------------------------------------------
    def _pack(self, biased: torch.Tensor) -> torch.Tensor:
        """int32[n] in 0..2K -> uint8[ceil(n * width / 8)]."""
        if self.width == 16:  # unsigned little-endian: fields up to 2K = 65534 (not int16)
            return torch.stack([biased & 255, biased >> 8], dim=1).to(torch.uint8).reshape(-1)
        if self.width == 8:
            return biased.to(torch.uint8)
        n = biased.numel()
        padded = torch.zeros(n + (n & 1), dtype=torch.uint8, device=biased.device)
        padded[:n] = biased
        pairs = padded.view(-1, 2)
        return pairs[:, 0] | (pairs[:, 1] << 4)

    def _unpack(self, levels: torch.Tensor, n: int) -> torch.Tensor:
        """uint8 fields -> int32[n] biased sums."""
        if self.width == 16:
            pairs = levels[:2 * n].to(torch.int32).view(n, 2)
            return pairs[:, 0] | (pairs[:, 1] << 8)
        if self.width == 8:
            return levels[:n].to(torch.int32)
        both = torch.stack([levels & 15, levels >> 4], dim=1).reshape(-1)
        return both[:n].to(torch.int32)
