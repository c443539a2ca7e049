"""The adapter to Horovod's optimizer: the objects passed as ``compression=`` to
``hvd.DistributedOptimizer``, their factories (``hgc.Compression``, also used by the DDP hook),
the parameter index, the checkpoint helpers and the optimizer checks. (Named ``hvd_adapter``,
not ``horovod``, so that it never reads as Horovod itself in a traceback or an import.)

Importing it under an MPI launcher initializes MPI before ``hvd.init()`` can, so that
Horovod never finalizes MPI under a running exchange (:mod:`horovod_gradcomp.transports.mpi_lifetime`).
"""
from ..transports.mpi_lifetime import initialize_mpi_before_horovod
from .compression import CodecCompression
from .dense import DenseCompression
from .factories import Compression
from .optimizer_check import OptimizerMismatchError
from .options_check import UnsupportedHorovodOption

initialize_mpi_before_horovod()

__all__ = ["CodecCompression", "Compression", "DenseCompression", "OptimizerMismatchError", "UnsupportedHorovodOption"]
