"""horovod_gradcomp: gradient compression for data-parallel PyTorch training with Horovod.

A thin facade: everything is defined in the subpackages and re-exported here, including the
errors a user may catch: :class:`ExchangeMismatchError` (ranks disagree on what they exchange),
:class:`MalformedPayloadError` (a received payload does not fit its codec),
:class:`OptimizerMismatchError` (DGC and the wrapped optimizer), :class:`UnsupportedHorovodOption`,
:class:`NativeUnavailableError`, :class:`UnsafeCheckpointError` (a checkpoint holding code) and
``hgc.ddp.DDPExchangeError`` (a failed DDP step).
"""
from ._version import __version__
from .native import (NativeUnavailableError, native_available, native_cuda_status, native_error,
                     native_has_cuda, twin_available)
from .codecs import Codec, Payload, available_codecs, get_codec, register_codec
from .codecs.payload_checks import MalformedPayloadError
from .errors import ExchangeMismatchError
from .state import DensitySchedule, DGCMemory, UnsafeCheckpointError
from .hvd_adapter import Compression, OptimizerMismatchError, UnsupportedHorovodOption
from .hvd_adapter.checkpoint import load_job_state, save_job_state
from .optim import OnebitAdam, OnebitAdamW
from .training import DoubleBufferedStep, double_buffering_pays
from .training.schemes import ADAG, EASGD, Downpour, ModelAveraging, Scheme
from . import ddp, elastic  # noqa: E402  (hgc.ddp.register: DDP comm hook; hgc.elastic.TorchState)
from . import fsdp  # noqa: E402  (hgc.fsdp.register: codecs inside FSDP2's reduce-scatter)

__all__ = [
    "__version__", "ADAG", "Codec", "Compression", "DensitySchedule", "DGCMemory", "DoubleBufferedStep", "Downpour",
    "EASGD", "ExchangeMismatchError", "MalformedPayloadError", "ModelAveraging", "NativeUnavailableError",
    "OnebitAdam", "OnebitAdamW", "OptimizerMismatchError", "Payload", "Scheme", "available_codecs", "ddp", "elastic", "fsdp",
    "UnsupportedHorovodOption", "double_buffering_pays", "get_codec", "load_job_state", "native_available",
    "native_cuda_status", "native_error", "native_has_cuda", "twin_available", "register_codec", "save_job_state",
    "UnsafeCheckpointError",
]
