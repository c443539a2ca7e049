"""horovod_gradcomp: gradient compression for data-parallel PyTorch training with Horovod.

A thin facade: everything is defined in the submodules and re-exported here.
"""
from ._version import __version__
from .native import NativeUnavailableError, native_available, native_error, native_has_cuda
from .codecs import Codec, Payload, available_codecs, get_codec, register_codec
from .dgc_memory import DensitySchedule, DGCMemory
from .horovod_adapter import Compression
from .optimizer_check import OptimizerMismatchError
from .pipeline import DoubleBufferedStep, double_buffering_pays
from . import ddp, elastic  # noqa: E402  (hgc.ddp.register: DDP comm hook; hgc.elastic.TorchState)

__all__ = [
    "__version__", "Codec", "Compression", "DensitySchedule", "DGCMemory", "DoubleBufferedStep", "NativeUnavailableError",
    "OptimizerMismatchError", "Payload", "available_codecs", "ddp", "elastic",
    "double_buffering_pays", "get_codec", "native_available", "native_error", "native_has_cuda", "register_codec",
]
