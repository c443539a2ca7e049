"""The Horovod side: the objects passed as ``compression=`` to ``hvd.DistributedOptimizer``,
their factories, the parameter index and the optimizer check.

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
