"""Loading of the native extension ``horovod_gradcomp._C``.

The extension is built by ``setup.py`` from ``csrc/``. Nothing falls back silently:
a codec asked for ``impl="native"`` raises :class:`NativeUnavailableError` (with the
original import error) when the extension did not load.
"""
from __future__ import annotations

_C = None
_error: str | None = None
try:  # pragma: no branch
    import torch  # noqa: F401  (the extension links against libtorch: load it first)
    from horovod_gradcomp import _C  # type: ignore[attr-defined,no-redef]
except Exception as exc:  # noqa: BLE001 - any failure to load is reported verbatim
    _C = None
    _error = f"{type(exc).__name__}: {exc}"


class NativeUnavailableError(RuntimeError):
    """The native extension is required but did not load."""


def native_available() -> bool:
    """True when ``horovod_gradcomp._C`` was imported."""
    return _C is not None


def native_error() -> str | None:
    """Why the extension did not load (None when it did)."""
    return _error


def native_has_cuda() -> bool:
    """True when the extension was built with its CUDA kernels."""
    return _C is not None and bool(_C.has_cuda())


def require_native():
    """Return the extension module, or raise naming the reason it is missing."""
    if _C is None:
        raise NativeUnavailableError(
            "horovod_gradcomp's native extension (horovod_gradcomp._C) is not available: "
            f"{_error}. Build it with `pip install --no-build-isolation -e .` (or `make install`), "
            "or ask explicitly for the slow pure-torch path with impl='reference'.")
    return _C
