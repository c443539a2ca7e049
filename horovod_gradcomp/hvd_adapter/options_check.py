"""Horovod options the codecs cannot honour, found at the first ``compress`` instead of later.

``hvd.DistributedOptimizer`` never shows its options to the compression, but it calls
``compress`` from its own methods: the first call looks up the calling optimizer on the stack
(the frame whose ``self`` holds this compression as ``_compression``) and checks it once:

* ``op=hvd.Adasum``: not a linear reduction of gradients; the codecs exchange means.
* a ``process_set`` other than the global one that the compression was not built for (pass
  the same ``process_set=`` to the factory: its exchange then runs on the set's ranks).
* a sparse tensor handed to ``compress`` (Horovod hands it only the dense copy, with
  ``sparse_as_dense=True``; a sparse gradient it allgathers itself never reaches ``compress``).

``op=hvd.Sum`` and ``gradient_predivide_factor`` work (the placeholder that Horovod reduces
carries the scaling); ``backward_passes_per_step`` and ``groups`` need nothing special.
"""
from __future__ import annotations

import sys
from typing import Optional

import torch


class UnsupportedHorovodOption(ValueError):
    """A ``hvd.DistributedOptimizer`` option that the compressed exchange cannot honour."""


def _caller_locals(compression, depth: int) -> Optional[dict]:
    """The locals of the nearest frame, at most ``depth`` frames above the public function that
    called this one's caller, whose ``self`` holds ``compression`` as ``_compression`` (Horovod's
    optimizer method); None when there is none."""
    frame = sys._getframe(3)
    for _ in range(depth):
        if frame is None:
            return None
        owner = frame.f_locals.get("self")
        if owner is not None and getattr(owner, "_compression", None) is compression:
            return frame.f_locals
        frame = frame.f_back
    return None


def calling_optimizer(compression, depth: int = 6) -> Optional[object]:
    """The object whose method called ``compression.compress`` (Horovod's optimizer), if any."""
    found = _caller_locals(compression, depth)
    return None if found is None else found["self"]


def check_horovod_options(optimizer, owner: str, communicator=None) -> None:
    """Raise :class:`UnsupportedHorovodOption` naming the first option the exchange cannot honour."""
    if optimizer is None:
        return
    import horovod.torch as hvd
    if getattr(optimizer, "op", None) == hvd.Adasum or hasattr(optimizer, "_starting_models"):  # Adasum's class
        raise UnsupportedHorovodOption(f"{owner}: op=hvd.Adasum is not supported (it is not a linear reduction; the "
                                       "codecs exchange means): use op=hvd.Average or hvd.Sum")
    process_set = getattr(optimizer, "process_set", None)
    if process_set is not None and getattr(process_set, "process_set_id", 0) not in (0, None):
        ours = getattr(communicator, "process_set", None)
        if ours is None or getattr(ours, "process_set_id", None) != process_set.process_set_id:
            raise UnsupportedHorovodOption(
                f"{owner}: the optimizer uses process_set={process_set}, but the compression exchanges over "
                f"{communicator!r}: ranks outside the set would never join. Pass the same process_set= to the "
                "hgc.Compression factory")


def calling_parameter(compression, depth: int = 6) -> Optional[torch.Tensor]:
    """The parameter ``p`` of the Horovod optimizer method that called ``compression.compress``
    (``_allreduce_grad_async(self, p)``), if any."""
    found = _caller_locals(compression, depth)
    p = None if found is None else found.get("p")
    return p if isinstance(p, torch.Tensor) else None


def reduction_of(optimizer) -> str:
    """"sum" when the calling Horovod optimizer sums (``op=hvd.Sum``), else "mean"."""
    if optimizer is None:
        return "mean"
    import horovod.torch as hvd
    return "sum" if getattr(optimizer, "op", None) == hvd.Sum else "mean"


def check_dense(tensor: torch.Tensor, owner: str) -> None:
    """Raise :class:`UnsupportedHorovodOption` for a sparse gradient."""
    if tensor.is_sparse:
        raise UnsupportedHorovodOption(f"{owner}: compress() received a sparse tensor (no codec encodes one): use "
                                       "sparse_as_dense=True (the dense copy is compressed) or the default "
                                       "sparse_as_dense=False (Horovod allgathers sparse gradients itself)")
