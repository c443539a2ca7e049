"""A compression checkpoint is data, not code: written with ``torch.save``, read back only with
``torch.load(..., weights_only=True)``.

Every compression state (``state_dict()`` of a compression, of the DDP hook, of a whole job)
holds tensors, numbers, strings, bools, None and plain containers (dicts, lists, tuples) only:
the residuals, DGC's velocities and accumulations, the step counters, the options' reprs. That
is what PyTorch's restricted unpickler accepts, so reading one runs no code from the file.
Everything this package reads goes through :func:`load_data`: the file of
:func:`~horovod_gradcomp.hvd_adapter.checkpoint.save_job_state` and the ranks' parts that travel
between processes when a job's state is gathered or scattered (:func:`to_bytes` /
:func:`from_bytes`, the same format). A file or part holding any other object (a class
instance, a function, a numpy array) is refused with :class:`UnsafeCheckpointError`.
"""
from __future__ import annotations

import io
import pickle
from typing import Any, Union

import torch


class UnsafeCheckpointError(ValueError):
    """A compression checkpoint (file or rank's part) holds something other than tensors,
    numbers, strings and plain containers, so it is not loaded."""


def to_bytes(obj: Any) -> torch.Tensor:
    """``obj`` (a compression state: tensors, numbers, strings, plain containers) as a flat uint8
    tensor in ``torch.save``'s format, for a collective to carry."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def load_data(source: Union[str, io.BytesIO], what: str) -> Any:
    """``torch.load(source, weights_only=True)`` (tensors come back on the device they were saved
    from, as before); a file holding any other
    object than tensors, numbers, strings and plain containers raises
    :class:`UnsafeCheckpointError` naming ``what`` and the object the loader refused."""
    try:
        return torch.load(source, weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = str(exc).splitlines() or [type(exc).__name__]
        detail = next((line.strip() for line in lines if "Unsupported" in line), lines[0].strip())
        detail = detail.split(" was not an allowed global")[0].replace("WeightsUnpickler error: ", "")
        raise UnsafeCheckpointError(
            f"{what}: refused: it holds an object other than tensors, numbers, strings and plain containers "
            f"({detail}). A compression state is data, not code: it is read with torch.load(weights_only=True) "
            "only, and a compression's state_dict() never holds such objects") from exc


def from_bytes(data: torch.Tensor, what: str) -> Any:
    """What :func:`to_bytes` wrote, read back with :func:`load_data` (``data``: uint8, any device)."""
    return load_data(io.BytesIO(data.cpu().numpy().tobytes()), what)


__all__ = ["UnsafeCheckpointError", "from_bytes", "load_data", "to_bytes"]
