"""The codes of torch's ScalarType enum (c10/core/ScalarType.h): a list of dtypes travels to the
native ops as these codes (:mod:`horovod_gradcomp.ops` binds the ops, :mod:`horovod_gradcomp.ops_fake`
gives them fake kernels; both read the table here)."""
from __future__ import annotations

import torch

DTYPE_CODES = {torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
               torch.float16: 5, torch.float32: 6, torch.float64: 7, torch.complex64: 9,
               torch.complex128: 10, torch.bool: 11, torch.bfloat16: 15}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


def as_dtype(d):
    """``d`` as a torch dtype when it is a known ScalarType code; anything else as it is."""
    return CODE_DTYPES.get(d, d) if isinstance(d, int) else d


__all__ = ["CODE_DTYPES", "DTYPE_CODES", "as_dtype"]
