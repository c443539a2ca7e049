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
FSDP and DeepSpeed do not use DDP comm hooks and are not supported here; a model FSDP2 shards
(``fsdp_version=2``) is refused with a message pointing to :func:`horovod_gradcomp.fsdp.register`.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..ddp import DDPCompressionState
from ..ddp import register as ddp_register
from .job_state import JobCompressionState


def register(accelerator, model, codec: str = "onebit", *, checkpoint: bool = True,
             **options) -> Optional[DDPCompressionState]:
    """Register ``codec``'s exchange on ``model`` (what ``accelerator.prepare`` returned) and
    return the hook's state (``stats()``, ``set_epoch(epoch)``, ``state_dict()``).

    ``options`` go to :func:`horovod_gradcomp.ddp.register` (e.g. ``pattern="two_phase"``,
    ``density=0.01``). ``checkpoint``: also register the whole job's compression state with
    ``accelerator.register_for_checkpointing`` (see the module doc). Call it on every process
    at the same point (it creates a process group). With one process Accelerate does not wrap
    the model, there is nothing to exchange, and this returns None. ``TypeError`` if the job
    has several processes but ``model`` is not a DDP model (FSDP, DeepSpeed, or a model that
    was not prepared)."""
    ddp = getattr(model, "_orig_mod", model)  # torch.compile's wrapper around the DDP model
    from torch.distributed.fsdp import FSDPModule
    if isinstance(ddp, FSDPModule):
        raise TypeError("hgc.integrations.accelerate.register: the model is sharded by FSDP2 (Accelerate's FSDP "
                        "plugin with fsdp_version=2), which has no DDP comm hook; this integration does not cover "
                        "it yet (untested with Accelerate's plugin): call hgc.fsdp.register(model, codec, "
                        "optimizer=optimizer) on the prepared model on every process instead, and checkpoint its "
                        "state with torch.distributed.checkpoint (see docs/guide/fsdp.md)")
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
