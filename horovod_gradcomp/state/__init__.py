"""Per-rank state between steps (what ``state_dict()`` saves): error-feedback residuals, DGC's
velocity, accumulation and warm-up, the two-phase owner residuals and the step counter."""
from .checkpoint_data import UnsafeCheckpointError
from .compression_state import CompressionState
from .dgc_memory import DensitySchedule, DGCMemory
from .error_feedback import ErrorFeedback, encode_with_residual
from .low_precision_feedback import LowPrecisionErrorFeedback
from .memory import Memory

__all__ = ["UnsafeCheckpointError", "CompressionState", "DensitySchedule", "DGCMemory", "ErrorFeedback", "LowPrecisionErrorFeedback", "Memory",
           "encode_with_residual"]
