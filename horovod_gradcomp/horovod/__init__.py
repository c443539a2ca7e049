"""The Horovod side: the objects passed as ``compression=`` to ``hvd.DistributedOptimizer``,
their factories, the parameter index and the optimizer check."""
from .compression import CodecCompression
from .dense import DenseCompression
from .factories import Compression
from .optimizer_check import OptimizerMismatchError
from .options_check import UnsupportedHorovodOption

__all__ = ["CodecCompression", "Compression", "DenseCompression", "OptimizerMismatchError", "UnsupportedHorovodOption"]
