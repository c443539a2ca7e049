"""Guards for jobs on gloo against PyTorch 2.13's abort at interpreter exit.

The abort, seen in core dumps of plain DDP and of this package's examples: a gloo worker thread
frees a finished work. When it holds the last reference to something Python owns, freeing it
takes the GIL; if the main thread has meanwhile begun to finalize the interpreter, taking the
GIL ends the worker with ``pthread_exit``, the unwinding meets the work's ``noexcept``
destructor, and the process aborts ("terminate called without an active exception", exit
status -6) after the script itself has finished. Two things a work can hold last:

1. The context of a backward. ``backward()`` stashes ``contextvars.copy_context()`` in
   thread-local state for the length of the backward and erases it afterwards; every collective
   issued meanwhile (DDP's own bucket allreduces, a comm hook's) copies that state into its
   work. A three-step plain DDP script aborted in 7 of 20 two-process runs beside busy
   processes on this project's 2-core machine; with :func:`hold_backward_context`, 0 of 20.
   It keeps one more reference to each backward's context (natively, in
   ``horovod_gradcomp._C``) until the next backward replaces it, and the last one until the
   process ends, after Python has finalized, where PyTorch skips the release.
   :func:`horovod_gradcomp.ddp.register` applies it to the model it hooks; call it on a plain
   DDP model.
2. A tensor's Python object. PyTorch releases it whenever the tensor's C++ reference count
   drops from 2 to 1, so a worker that frees the last collective of a tensor created in Python
   (``all_gather_object``'s buffers, a flag to ``all_reduce``, a digest to ``all_gather``)
   releases its Python object, even while Python still refers to it. :func:`keep_until_exit`
   adds a C++ reference that is never released. Use it for the job's last collectives (the
   hook keeps its own recent collectives referenced, and frees them on the main thread).
   :func:`hold_latest` does the same for collectives a job repeats (a checkpoint's gather,
   :func:`horovod_gradcomp.integrations.gather_job_state`): each call releases the slot's
   previous tensors, so one set is held at a time.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn

from ..native import NativeUnavailableError, native_available, native_error, require_native

_HANDLE = "_hgc_backward_context_hold"   # the module attribute holding hold_backward_context's hook


def hold_backward_context(module: nn.Module):
    """On every forward of ``module`` (a DDP model, the module inside it, or a LightningModule
    whose ``training_step`` calls it), mark its output so that the backward through it holds its
    stashed context (reason 1 above). Gradients are not touched. Returns the forward hook's
    handle (``.remove()`` undoes it); a second call on the same module returns the first one's.
    Raises :class:`NativeUnavailableError` when the native extension did not load."""
    _native("hold_backward_context")
    if not isinstance(module, nn.Module):
        raise TypeError(f"hold_backward_context: expected an nn.Module, got {type(module).__name__}")
    handle = getattr(module, _HANDLE, None)
    if handle is None or handle.id not in module._forward_hooks:
        handle = module.register_forward_hook(_mark_output)
        setattr(module, _HANDLE, handle)
    return handle


def keep_until_exit(*tensors: torch.Tensor) -> None:
    """Hold a C++ reference to each of ``tensors`` (given to a collective on gloo) until the
    process ends (reason 2 above). Meant for the few small tensors of a job's last collectives:
    nothing kept is ever freed. Raises :class:`NativeUnavailableError` when the native extension
    did not load."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"keep_until_exit: expected tensors, got {type(t).__name__}")
    _native("keep_until_exit").keep_until_exit(list(tensors))


def hold_latest(slot: str, *tensors: torch.Tensor) -> None:
    """:func:`keep_until_exit` for a collective a job repeats: hold a C++ reference to each of
    ``tensors`` under ``slot``, releasing (on this thread) the tensors the slot held before. The
    slot's last tensors are held until the process ends. Raises :class:`NativeUnavailableError`
    when the native extension did not load."""
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"hold_latest: expected tensors, got {type(t).__name__}")
    _native("hold_latest").hold_latest(str(slot), list(tensors))


def _native(who: str):
    """The native extension, or :class:`NativeUnavailableError` naming ``who``."""
    if not native_available():
        raise NativeUnavailableError(f"{who} needs horovod_gradcomp._C: {native_error()}")
    return require_native()


def _retain(grad: torch.Tensor) -> None:
    require_native().retain_backward_context()


def _mark_output(module: nn.Module, inputs, output) -> None:
    tensor = _first_grad_tensor(output)
    if tensor is not None:
        tensor.register_hook(_retain)


def _first_grad_tensor(obj) -> Optional[torch.Tensor]:
    """The first tensor that requires grad in a (nested) tensor, list, tuple or dict; None if
    there is none (a forward under ``no_grad``, an evaluation)."""
    if isinstance(obj, torch.Tensor):
        return obj if obj.requires_grad else None
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None
