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

The other end of the lifetime: :func:`mpi_abort` ends the whole job (the stall watchdog's exit),
and :func:`register_exit_check` makes a process that exits while another of its threads is still
inside an exchange abort the job rather than finalize MPI under that thread.
"""
from __future__ import annotations

import atexit
import multiprocessing
import os
import sys
import warnings
from typing import Callable, List

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


def mpi_abort(message: str) -> None:
    """Print ``message`` and end the whole MPI job (every rank, and mpirun with them)."""
    print(message, file=sys.stderr, flush=True)
    from mpi4py import MPI
    MPI.COMM_WORLD.Abort(1)


#: Questions "is another thread of this process inside an exchange?", asked at exit.
_BUSY: List[Callable[[], bool]] = []
_exit_check_registered = False


def abort_at_exit_while(busy: Callable[[], bool]) -> None:
    """Have :func:`register_exit_check`'s handler end the MPI job when ``busy()`` is True at exit
    (the exchange's stall watchdog declares its open guards here)."""
    if busy not in _BUSY:
        _BUSY.append(busy)


def register_exit_check() -> None:
    """Register :func:`abort_if_busy` once, at the MPI transport's first duplicate: after
    ``hvd.init()`` and after mpi4py's import, so that it runs before Horovod's shutdown and
    MPI's finalize (``atexit`` runs the latest registration first)."""
    global _exit_check_registered
    if not _exit_check_registered:
        _exit_check_registered = True
        atexit.register(abort_if_busy)


def abort_if_busy() -> None:
    """At exit: when another thread of this process is still inside an exchange (a rank failed
    mid-step while the communication thread waits in a collective), end the MPI job with
    ``MPI_Abort`` and a message, instead of letting MPI be finalized under that thread."""
    if any(busy() for busy in _BUSY):
        mpi_abort("horovod_gradcomp: this process exits while another of its threads is still inside an exchange "
                  "(a rank failed during a step); aborting the MPI job rather than finalizing MPI under it")
