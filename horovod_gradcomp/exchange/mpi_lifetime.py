"""Who initializes MPI decides who finalizes it, and Horovod finalizes it at the wrong time.

When ``hvd.init()`` is the first to initialize MPI, Horovod also finalizes it, from its
background thread, as soon as its loop stops; and the loop of every rank stops as soon as
*any* rank shuts Horovod down (at that rank's exit, say). So a rank that finishes first
finalizes MPI on the other ranks while their main threads may still be inside an mpi4py call
of the exchange (the last step's collective, the duplicate of the communicator): a
segmentation fault (checked: rank 1's ``MPI.Is_finalized()`` turns True while its main
thread still runs, seconds after rank 0 exits).

When MPI is already initialized at ``hvd.init()``, Horovod leaves it alone, and mpi4py
finalizes it at this process's own exit, after Horovod's shutdown. So importing
horovod_gradcomp under an MPI launcher initializes MPI through mpi4py
(:func:`initialize_mpi_before_horovod`), unless ``HOROVOD_GRADCOMP_MPI_INIT=0``. Outside an
MPI launcher (a lone process, torchrun, ``horovodrun --gloo``), and in the child processes of
a rank (a DataLoader's spawned workers import the training script's modules again, with the
launcher's environment), nothing is initialized.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
import warnings

ENV_VAR = "HOROVOD_GRADCOMP_MPI_INIT"
#: Set by MPI launchers in every process: Open MPI, PMI (MPICH/Hydra, Intel MPI), PMIx.
LAUNCHER_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS")


def launched_by_mpi() -> bool:
    """True when an MPI launcher (mpirun, mpiexec, srun with PMI/PMIx) started this process."""
    return any(os.environ.get(v) for v in LAUNCHER_ENV)


def horovod_initialized() -> bool:
    """True when ``horovod.torch`` is imported and initialized (without importing it)."""
    hvd = sys.modules.get("horovod.torch")
    return bool(hvd is not None and hvd.is_initialized())


def initialize_mpi_before_horovod() -> str:
    """Initialize MPI (through mpi4py, MPI_THREAD_MULTIPLE) when launched by MPI and Horovod
    has not initialized it yet; returns what happened: "initialized", "already" (mpi4py was
    imported before), "horovod" (``hvd.init()`` ran first: warned, see the module doc),
    "off" (``HOROVOD_GRADCOMP_MPI_INIT=0``), "no launcher", "child process" or "no mpi4py"."""
    if os.environ.get(ENV_VAR, "1") == "0":
        return "off"
    if not launched_by_mpi():
        return "no launcher"
    if multiprocessing.parent_process() is not None or multiprocessing.current_process().name != "MainProcess":
        return "child process"  # (a spawned child is named before it imports the main module again)
    if horovod_initialized() and "mpi4py.MPI" not in sys.modules:
        warnings.warn("horovod_gradcomp was imported after hvd.init(): MPI was initialized by Horovod, whose "
                      "background thread finalizes it as soon as any rank shuts Horovod down, even while this rank "
                      "is still inside an exchange (a segmentation fault). Import horovod_gradcomp before calling "
                      "hvd.init().", RuntimeWarning, stacklevel=3)
        return "horovod"
    if "mpi4py.MPI" in sys.modules:
        return "already"
    try:
        from mpi4py import MPI  # noqa: F401 - the import initializes MPI (mpi4py.rc: thread level "multiple")
    except ImportError:
        return "no mpi4py"  # the mpi transport is then unavailable anyway
    return "initialized"
