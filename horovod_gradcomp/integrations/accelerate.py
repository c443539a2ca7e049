"""Accelerate: the codec's DDP comm hook on the model ``accelerator.prepare`` returned.

    from accelerate import Accelerator
    from horovod_gradcomp.integrations import accelerate as hgc_accelerate

    accelerator = Accelerator()
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = hgc_accelerate.register(accelerator, model, "onebit")   # after prepare, before training
    ...                                                               # accelerator.backward(loss), optimizer.step()
    accelerator.save_state("ckpt")       # every rank's compression state goes with it

``accelerator.prepare`` wraps the model in ``DistributedDataParallel`` when the job has more
than one process (multi-CPU on gloo, multi-GPU on NCCL); :func:`register` puts
:func:`horovod_gradcomp.ddp.register`'s hook on it and registers a
:class:`~horovod_gradcomp.integrations.JobCompressionState` with
``accelerator.register_for_checkpointing``: ``save_state`` (called on every process, as
Accelerate requires) gathers every rank's compression state (error-feedback residuals etc.)
into rank 0's ``custom_checkpoint_<i>.pkl`` and ``load_state`` gives each rank its own part
back. Accelerate numbers those files in registration order: register the same objects in
the same order before ``load_state`` as before ``save_state``.

Accelerate's own ``DistributedDataParallelKwargs(comm_hook=...)`` offers only PyTorch's hooks.

FSDP2 (``FullyShardedDataParallelPlugin(fsdp_version=2)``): ``accelerator.prepare`` returns a model
that ``fully_shard`` has sharded; :func:`register` then calls :func:`horovod_gradcomp.fsdp.register`
on it (the codec inside FSDP2's reduce-scatter, or between nodes in HSDP mode) and registers the
job's compression state for ``save_state`` / ``load_state`` in the same way (every rank's
per-rank state gathered into rank 0's ``custom_checkpoint_<i>.pkl``; same world size only). Pass
``optimizer=`` (the prepared optimizer) for the Adam-aware defaults. Accelerate runs its FSDP
plugin on accelerators only (on the CPU it prepares a DDP model instead): what is tested here is
this function on a model sharded by ``fully_shard`` under a multi-CPU ``Accelerator``, with its
``save_state`` / ``load_state``. FSDP1 and DeepSpeed models are refused (no hook to set).
"""
from __future__ import annotations

import torch

from ..ddp import register as ddp_register
from .job_state import JobCompressionState


def register(accelerator, model, codec: str = "onebit", *, checkpoint: bool = True, **options):
    """Register ``codec``'s exchange on ``model`` (what ``accelerator.prepare`` returned) and
    return the hook's state (``stats()``, ``set_epoch(epoch)``, ``state_dict()``).

    ``options`` go to :func:`horovod_gradcomp.ddp.register` (e.g. ``pattern="two_phase"``,
    ``density=0.01``). ``checkpoint``: also register the whole job's compression state with
    ``accelerator.register_for_checkpointing`` (see the module doc). Call it on every process
    at the same point (it creates a process group). With one process Accelerate does not wrap
    the model, there is nothing to exchange, and this returns None. ``TypeError`` if the job
    has several processes but ``model`` is not a DDP model (FSDP1, DeepSpeed, or a model that
    was not prepared).

    A model sharded by FSDP2 (Accelerate's plugin with ``fsdp_version=2``): the codec through
    :func:`horovod_gradcomp.fsdp.register` (``options`` are its own, e.g. ``optimizer=``,
    ``mode=``, ``residual_dtype=``); returns its state (``FSDPCompressionState`` or
    ``HSDPCompressionState``)."""
    ddp = getattr(model, "_orig_mod", model)  # torch.compile's wrapper around the DDP model
    from torch.distributed.fsdp import FSDPModule
    if isinstance(ddp, FSDPModule):
        return _register_fsdp2(accelerator, ddp, codec, checkpoint, options)
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        if accelerator.num_processes == 1:
            return None
        raise TypeError(f"hgc.integrations.accelerate.register: expected the DistributedDataParallel model that "
                        f"accelerator.prepare returns for {accelerator.num_processes} processes, got "
                        f"{type(model).__name__} (distributed type {accelerator.distributed_type}); pass the prepared "
                        "model (FSDP and DeepSpeed have no DDP comm hooks)")
    state = ddp_register(ddp, codec, **options)
    if checkpoint:
        accelerator.register_for_checkpointing(JobCompressionState(state))
    return state


def _register_fsdp2(accelerator, model, codec: str, checkpoint: bool, options: dict):
    """:func:`register` for a model FSDP2 shards: :func:`horovod_gradcomp.fsdp.register`, and the
    job's per-rank compression state for Accelerate's checkpoints (the compression's own
    ``state_dict``, HSDP mode's ``state.per_rank``: not the DCP form of the states' ``state_dict``,
    which Accelerate's pickled custom objects cannot hold)."""
    from ..fsdp import register as fsdp_register
    state = fsdp_register(model, codec, **options)
    if checkpoint:
        per_rank = state.compression if state.mode == "sharded" else state.per_rank
        accelerator.register_for_checkpointing(JobCompressionState(per_rank))
    return state
