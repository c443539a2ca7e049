"""The checks every DDP entry point (:func:`hgc.ddp.register <horovod_gradcomp.ddp.hook.register>`,
:func:`hgc.ddp.onebit_adam <horovod_gradcomp.ddp.local_hook.onebit_adam>`) makes on what it is given."""
from __future__ import annotations

from typing import Iterable, Mapping

import torch


def require_ddp_model(ddp_model, who: str) -> None:
    """TypeError, naming ``who``, unless ``ddp_model`` is a DistributedDataParallel model."""
    if not isinstance(ddp_model, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"{who} expects a DistributedDataParallel model, got {type(ddp_model).__name__}")


def refuse_options(options: Mapping[str, object], keys: Iterable[str], who: str, why: str) -> None:
    """ValueError, naming ``who``, the first of ``keys`` given in ``options``, and ``why`` it does not apply."""
    for key in keys:
        if key in options:
            raise ValueError(f"{who}: {key}= does not apply {why}")


__all__ = ["refuse_options", "require_ddp_model"]
