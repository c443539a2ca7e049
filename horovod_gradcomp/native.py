"""Loading of the native extension ``horovod_gradcomp._C``.

The extension is built by ``setup.py`` from ``csrc/``; its ops are PyTorch custom ops
(``torch.ops.hgc.*``, bound on the module by :mod:`horovod_gradcomp.ops`). Nothing falls back silently:
a codec asked for ``impl="native"`` raises :class:`NativeUnavailableError` (with the
original import error) when the extension did not load.
"""
from __future__ import annotations

_C = None
_error: str | None = None
try:  # pragma: no branch
    import torch  # noqa: F401  (the extension links against libtorch: load it first)
    from . import _C  # type: ignore[attr-defined,no-redef]  (the compiled module beside this file)
    from horovod_gradcomp.ops import bind as _bind

    _bind(_C, "hgc")  # its ops (torch.ops.hgc.*) on the module, under their Python names
except Exception as exc:  # noqa: BLE001 - any failure to load is reported verbatim
    _C = None
    _error = f"{type(exc).__name__}: {exc}"


class NativeUnavailableError(RuntimeError):
    """The native extension is required but did not load."""


def native_available(device: str | None = None) -> bool:
    """True when ``horovod_gradcomp._C`` was imported; with ``device="cuda"``, when it also
    runs the codecs on CUDA tensors (built with its CUDA kernels and a GPU is visible).
    :func:`native_cuda_status` says why not."""
    if device is None or str(device).split(":")[0] == "cpu":
        return _C is not None
    if str(device).split(":")[0] != "cuda":
        raise ValueError(f"native_available: device must be 'cpu' or 'cuda', got {device!r}")
    return native_cuda_status()[0]


def native_cuda_status() -> tuple:
    """``(usable, reason)``: whether the native codecs run on CUDA tensors, and a sentence
    saying which path CUDA gradients take and why (nothing falls back silently: without
    the CUDA kernels, ``impl="native"`` codecs raise on CUDA tensors)."""
    if _C is None:
        return False, f"the native extension did not load ({_error}); CUDA tensors need impl='reference'"
    if not bool(_C.has_cuda()):
        return False, ("horovod_gradcomp._C was built without its CUDA kernels (at build time PyTorch had no "
                       "CUDA, nvcc was not found, or HGC_WITH_CUDA=0); rebuild with CUDA, or use "
                       "impl='reference' for CUDA tensors")
    import torch

    if not torch.cuda.is_available():
        return False, "horovod_gradcomp._C has its CUDA kernels, but torch.cuda.is_available() is False"
    return True, f"native CUDA kernels of horovod_gradcomp._C ({torch.cuda.get_device_name()})"


def require_native_device(device, who: str) -> None:
    """Raise :class:`NativeUnavailableError` (naming ``who`` and the reason) when the native
    kernels cannot take tensors on ``device``; a no-op for CPU tensors."""
    if getattr(device, "type", str(device).split(":")[0]) == "cpu":
        return
    if _C is None or not bool(_C.has_cuda()):
        raise NativeUnavailableError(f"{who}: got tensors on {device}, but {native_cuda_status()[1]}")


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


# -- the OpenMP twin of the device kernels ------------------------------------------------------
#
# ``horovod_gradcomp._C_twin`` is csrc/device/ (the GPU path's Thrust sources) built by g++ with
# Thrust's OpenMP backend: the same algorithm calls and functors as the CUDA build, run on CPU
# tensors, its ops under torch.ops.hgc_twin. It exists so that the GPU path is executed in CI;
# codecs use it with impl="twin".
# HGC_TWIN_PATH=<file.so> loads that build instead (ci/build_twin_dev.py: a twin of some codecs).
_C_twin = None
_twin_error: str | None = None
try:  # pragma: no branch
    import os as _os

    if _os.environ.get("HGC_TWIN_PATH"):
        import importlib.util as _ilu
        import sys as _sys

        _spec = _ilu.spec_from_file_location("horovod_gradcomp._C_twin", _os.environ["HGC_TWIN_PATH"])
        _C_twin = _ilu.module_from_spec(_spec)
        _spec.loader.exec_module(_C_twin)
        _sys.modules["horovod_gradcomp._C_twin"] = _C_twin
    else:
        from . import _C_twin  # type: ignore[attr-defined,no-redef]
    from horovod_gradcomp.ops import bind as _bind

    _bind(_C_twin, "hgc_twin")  # its ops (torch.ops.hgc_twin.*) on the module
except Exception as exc:  # noqa: BLE001 - reported verbatim by require_twin
    _C_twin = None
    _twin_error = f"{type(exc).__name__}: {exc}"


def twin_available() -> bool:
    """True when the OpenMP twin of the device kernels (``_C_twin``) was imported."""
    return _C_twin is not None


def require_twin():
    """Return the twin module, or raise naming why it is missing (never a silent fallback)."""
    if _C_twin is None:
        raise NativeUnavailableError(
            "the OpenMP twin of horovod_gradcomp's device kernels (horovod_gradcomp._C_twin) is not available: "
            f"{_twin_error}. It is a test-time build: `make test` builds it (ci/build_twin.sh), or "
            "`HGC_WITH_TWIN=only python setup.py build_ext --inplace`; it needs CCCL's headers (CUDA toolkit or "
            "`pip install nvidia-cuda-cccl`).")
    return _C_twin


def kernels_for(impl: str, who: str):
    """The extension module a codec built with ``impl`` calls: ``_C`` for "native", the twin for
    "twin" (CPU tensors through the device sources); raises for a missing module."""
    if impl == "native":
        return require_native()
    if impl == "twin":
        return require_twin()
    raise ValueError(f"{who}: no native kernels for impl={impl!r}")
