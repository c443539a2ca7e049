"""The first collective of every bucket: do the ranks agree, and is every gradient finite?

One allgather of ``PREAMBLE_BYTES`` per rank carries a 16-byte digest of what this rank is
about to exchange (codec options, memory options, pattern, world size, every name, shape and
dtype) and one flag byte: "some gradient of this bucket is NaN or Inf here". It comes before
any collective whose sizes or meaning depend on those things (shared scales, payloads), so
ranks that disagree fail on every rank with :class:`ExchangeMismatchError` instead of pairing
the wrong buffers or hanging, and a non-finite gradient on one rank is known to all.

The flag is this rank's check of the bucket (:mod:`horovod_gradcomp.exchange.nonfinite_check`, or
:func:`has_nonfinite` where nothing else reads the gradients before the preamble).
"""
from __future__ import annotations

import hashlib
from typing import Mapping, Optional, Sequence

import numpy as np
import torch

from ..errors import ExchangeMismatchError
from .requests import Collective, Steps
from .stats import ExchangeStats

DIGEST_BYTES = 16
PREAMBLE_BYTES = 24  # digest, flag byte, padding to 8


def has_nonfinite(grads: Mapping[str, torch.Tensor]) -> bool:
    """True when any value of any gradient is NaN or +-Inf (one reduction per tensor, one sync):
    the check where no encode pass covers it (kind ``"pass"`` of :mod:`~horovod_gradcomp.exchange.nonfinite_check`).

    A NaN or Inf makes the tensor's sum non-finite; a sum of finite values overflows only past
    the accumulation type's range (float32 for narrow dtypes), which a gradient does not reach."""
    sums = [g.sum(dtype=torch.float64 if g.dtype == torch.float64 else torch.float32).reshape(1)
            for g in grads.values() if g.numel()]
    if not sums:
        return False
    return not bool(torch.isfinite(torch.cat([s.to(sums[0].device, torch.float64) for s in sums])).all())


def preamble_steps(comm, what: str, signature: Sequence[str], nonfinite: bool, check: bool = True,
                   stats: Optional[ExchangeStats] = None) -> Steps:
    """The preamble as a request sequence (:mod:`horovod_gradcomp.exchange.requests`): one
    allgather (none on one rank); returns True when any rank flagged non-finite gradients.
    ``stats``: where the digest and the check are timed (``exchange_s``, phase ``preamble``).

    Raises :class:`ExchangeMismatchError` on every rank when ``check`` and the ranks' signatures
    differ (every rank sees every digest, so every rank raises)."""
    stats = stats if stats is not None else ExchangeStats()
    with stats.timed("exchange_s", phase="preamble"):
        mine = np.zeros(PREAMBLE_BYTES, dtype=np.uint8)
        if check:
            digest = hashlib.blake2b("\n".join(signature).encode(), digest_size=DIGEST_BYTES).digest()
            mine[:DIGEST_BYTES] = np.frombuffer(digest, dtype=np.uint8)
        mine[DIGEST_BYTES] = 1 if nonfinite else 0
    if comm.size > 1:
        every = (yield Collective("allgather", (torch.from_numpy(mine),), comm, "preamble", "preamble")).cpu().numpy()
    else:
        every = mine[None, :]
    with stats.timed("exchange_s", phase="preamble"):
        differ = [r for r in range(every.shape[0])
                  if check and not np.array_equal(every[r, :DIGEST_BYTES], every[0, :DIGEST_BYTES])]
    if differ:
        raise ExchangeMismatchError(
            f"{what}: ranks {differ} disagree with rank 0 on what to exchange (world size, names, shapes, "
            f"dtypes, codec or memory options, pattern). This rank has {len(signature)} entries: "
            f"{list(signature)[:5]}... Every rank must build the same model and pass the same "
            "named_parameters and compression options.")
    return bool(every[:, DIGEST_BYTES].any())

