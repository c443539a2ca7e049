"""The shape every scheme shares: construction, ``step()``, ``finish()``, stats, checkpoints.

A scheme wraps a model and its (local) optimizer. ``step()`` runs ``optimizer.step()``
and then whatever the scheme exchanges at that local step; ``finish()`` leaves the same
parameters on every rank. Schemes use mpi4py on their own duplicate of ``COMM_WORLD``
(never Horovod's communicator); they need no Horovod and coexist with ``hvd.init()``.
The constructor, ``step()`` and ``finish()`` are collectives, each run under the stall
watchdog (``timeout=``, as for the compressions): a rank that stops taking part ends the
job with an error instead of a hang.
Parameters move as one flat vector on the CPU (copied to and from the model's device).
"""
from __future__ import annotations

import collections
from contextlib import contextmanager
from typing import Dict, List, Optional, Union

import numpy as np
import torch

from ...codecs import get_codec
from ...codecs.base import Codec
from ...exchange.watchdog import default_watchdog, resolve_timeout
from ...flags import require_flag
from ...state.error_feedback import ErrorFeedback
from .coding import RangeCoder, pieces_of_range


class SchemeConfigError(ValueError):
    """Ranks disagree on a scheme's configuration or model (raised on every rank)."""


def _mpi():
    from mpi4py import MPI  # deferred: importing horovod_gradcomp does not initialize MPI
    return MPI


class Scheme:
    """Base class: subclasses implement :meth:`_after_local_step` and :meth:`_finish`.

    Args:
        model: its parameters (all of them, in ``named_parameters()`` order) are the state
            that is averaged or sent; buffers (e.g. batch-norm statistics) stay local.
        optimizer: the local optimizer; ``step()`` calls ``optimizer.step()``.
        codec: ``None`` (raw values), a codec name for :func:`horovod_gradcomp.get_codec`,
            or a codec instance; it encodes what the scheme sends (pushes, differences).
        codec_options: options for ``get_codec`` when ``codec`` is a name.
        error_feedback: keep an error-feedback residual per encoded piece (codec only).
        comm: an mpi4py communicator to duplicate (default ``MPI.COMM_WORLD``).
        timeout: seconds a collective of the scheme may wait for the other ranks before the
            job is aborted (None: ``HOROVOD_GRADCOMP_STALL_TIMEOUT`` or 300; 0: no deadline).
    """

    name = "scheme"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                 codec: Union[None, str, Codec] = None, codec_options: Optional[dict] = None,
                 error_feedback: bool = True, comm=None, timeout: Optional[float] = None):
        MPI = _mpi()
        self.timeout = resolve_timeout(timeout)
        self.model, self.optimizer = model, optimizer
        named = [(n, p) for n, p in model.named_parameters()]
        if not named:
            raise ValueError(f"{self.name}: the model has no parameters")
        self.param_names: List[str] = [n for n, _ in named]
        self.params: List[torch.nn.Parameter] = [p for _, p in named]
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or not next(iter(dtypes)).is_floating_point:
            raise ValueError(f"{self.name}: all parameters must share one floating dtype, got {sorted(map(str, dtypes))}")
        self.dtype = next(iter(dtypes))
        self.numel = sum(p.numel() for p in self.params)
        base = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = base.Get_rank(), base.Get_size()
        with self.guard("construction"):
            self.comm = base.Dup()
        if isinstance(codec, str):
            codec = None if codec in ("none", "") else get_codec(codec, **(codec_options or {}))
        elif codec_options:
            raise ValueError(f"{self.name}: codec_options given without a codec name")
        self.codec: Optional[Codec] = codec
        self.feedback = (ErrorFeedback(enabled=require_flag(self.name, "error_feedback", error_feedback))
                         if codec is not None else None)
        self.local_steps = 0
        self.finished = False
        self._counters: Dict[str, int] = collections.Counter()
        with self.guard("construction"):
            self._check_agreement()
            # Every rank starts from rank 0's parameters.
            start = self.get_flat()
            self.comm.Bcast([start.numpy(), _mpi_type(self.dtype)], root=0)
        self.set_flat(start)

    # -- to implement --------------------------------------------------------------
    def _after_local_step(self) -> None:
        raise NotImplementedError

    def _finish(self) -> None:
        raise NotImplementedError

    def config_key(self) -> str:
        """Options every rank must share (subclasses add theirs)."""
        return f"{self.name} codec={self.codec.agreement_key() if self.codec else None} " \
               f"feedback={self.feedback!r} dtype={self.dtype}"

    # -- the loop ---------------------------------------------------------------------
    def step(self) -> None:
        """The local optimizer step, then the scheme's exchange when it is due."""
        if self.finished:
            raise RuntimeError(f"{self.name}: step() after finish()")
        self.optimizer.step()
        self.local_steps += 1
        with self.guard(f"local step {self.local_steps}"):
            self._after_local_step()

    def finish(self) -> None:
        """Collective: end the scheme; afterwards every rank's model holds the same
        parameters (the average or the center variable). Calling it again does nothing."""
        if self.finished:
            return
        with self.guard("finish"):
            self._finish()
        self.finished = True

    def stats(self) -> Dict[str, object]:
        """Counters of this rank: local steps, bytes sent and received by its worker, and
        the scheme's own counters (exchanges, pushes, pulls, center updates, staleness)."""
        out: Dict[str, object] = {"scheme": self.name, "rank": self.rank, "size": self.size,
                                  "local_steps": self.local_steps, "numel": self.numel,
                                  "bytes_sent": 0, "bytes_received": 0}
        out.update(self._counters)
        return out

    def state_dict(self) -> Dict[str, object]:
        return {"scheme": self.name, "config": self.config_key(), "local_steps": self.local_steps,
                "counters": dict(self._counters),
                "feedback": self.feedback.state_dict() if self.feedback is not None else None}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        if state.get("scheme") != self.name or state.get("config") != self.config_key():
            raise ValueError(f"{self.name}: checkpoint is for {state.get('config')!r}, this scheme is "
                             f"{self.config_key()!r}")
        self.local_steps = int(state["local_steps"])
        self._counters = collections.Counter(state["counters"])
        if self.feedback is not None and state.get("feedback") is not None:
            self.feedback.load_state_dict(state["feedback"])

    # -- helpers ----------------------------------------------------------------------
    @contextmanager
    def guard(self, what: str):
        """The block (collectives of this scheme) under the stall watchdog's deadline."""
        with default_watchdog().guard(self.timeout, f"{self.name}: {what} on rank {self.rank} of {self.size}"):
            yield

    def get_flat(self) -> torch.Tensor:
        """A CPU copy of the parameters as one flat vector."""
        return torch.cat([p.detach().reshape(-1).cpu() for p in self.params])

    def set_flat(self, flat: torch.Tensor) -> None:
        """Copy a flat CPU vector into the parameters."""
        off = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[off:off + n].view_as(p))
                off += n

    def range_coder(self, lo: int, hi: int) -> RangeCoder:
        pieces = pieces_of_range(self.param_names, [p.shape for p in self.params], lo, hi)
        return RangeCoder(pieces, lo, hi, self.dtype, self.codec, self.feedback)

    def count(self, key: str, n: int = 1) -> None:
        self._counters[key] += n

    def _check_agreement(self) -> None:
        shapes = ";".join(f"{n}:{tuple(p.shape)}" for n, p in zip(self.param_names, self.params))
        mine = f"{self.config_key()} params={shapes}"
        every = self.comm.allgather(mine)
        bad = [r for r, k in enumerate(every) if k != every[0]]
        if bad:
            raise SchemeConfigError(f"{self.name}: ranks {bad} disagree with rank 0 on the scheme or model: "
                                    f"rank 0 has {every[0]!r}, rank {bad[0]} has {every[bad[0]]!r}")


def _mpi_type(dtype: torch.dtype):
    MPI = _mpi()
    table = {torch.float64: MPI.DOUBLE, torch.float32: MPI.FLOAT}
    if dtype not in table:
        raise TypeError(f"schemes move float32 or float64 parameters, got {dtype}")
    return table[dtype]


def mpi_type(dtype: torch.dtype):
    """The MPI datatype of a float32/float64 tensor."""
    return _mpi_type(dtype)


def as_bytes(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().view(torch.uint8).numpy()
