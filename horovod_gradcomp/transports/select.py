"""The transport rule of the ``hgc.Compression`` factories (``transport=``).

``"auto"`` (the default):

* Horovod initialized on Gloo (``horovodrun --gloo``, Horovod elastic), or a
  ``process_set`` other than the global one -> ``"horovod"`` (Horovod's collectives);
* otherwise -> ``"mpi"`` (mpi4py on a duplicate of COMM_WORLD, as under ``mpirun``).

A Gloo launch whose ``hvd.init()`` has not run yet cannot be told apart from a lone MPI
process, and mpi4py would then see a world of one (silently wrong means): that case raises.
"""
from __future__ import annotations

import os
import sys

from .mpi import default_communicator
from .mpi_lifetime import horovod_initialized

TRANSPORTS = ("auto", "mpi", "horovod")
#: Set by horovodrun --gloo (and elastic) in every worker's environment.
_GLOO_LAUNCH_ENV = ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_HOSTNAME")


def _is_global(hvd, process_set) -> bool:
    return process_set is None or process_set is hvd.global_process_set or getattr(
        process_set, "process_set_id", None) == 0


def select_communicator(transport: str = "auto", process_set=None, owner: str = "Compression"):
    """The communicator for ``transport`` ("auto" | "mpi" | "horovod") and ``process_set``
    (a ``hvd.ProcessSet`` or None), by the rule of the module doc. The mpi choice returns
    the process-wide :func:`~horovod_gradcomp.transports.mpi.default_communicator`."""
    if transport not in TRANSPORTS:
        raise ValueError(f"{owner}: transport must be one of {TRANSPORTS}, got {transport!r}")
    hvd, initialized = sys.modules.get("horovod.torch"), horovod_initialized()   # Horovod not imported here
    if transport == "auto":
        if not initialized:
            if process_set is not None:
                raise RuntimeError(f"{owner}: process_set given but Horovod is not initialized; call hvd.init() first")
            if all(os.environ.get(v) for v in _GLOO_LAUNCH_ENV):
                raise RuntimeError(f"{owner}: launched by horovodrun with Gloo, but hvd.init() has not run yet; call "
                                   "hvd.init() before building the compression (or pass transport='horovod' after it)")
            return default_communicator()
        transport = "horovod" if hvd.gloo_enabled() or not _is_global(hvd, process_set) else "mpi"
    if transport == "horovod":
        if not initialized:
            raise RuntimeError(f"{owner}: transport='horovod' needs hvd.init() first")
        from .horovod_ops import HorovodCommunicator
        return HorovodCommunicator(process_set)
    # transport == "mpi"
    if hvd is not None and initialized and not _is_global(hvd, process_set):
        raise ValueError(f"{owner}: transport='mpi' runs over all of COMM_WORLD and cannot honour process_set="
                         f"{process_set}; use transport='horovod' (or 'auto')")
    if hvd is not None and initialized and hvd.gloo_enabled():
        raise ValueError(f"{owner}: transport='mpi' under Horovod on Gloo: mpi4py would see its own world, not "
                         "Horovod's ranks; use transport='horovod' (or 'auto')")
    return default_communicator()
