"""DDP with an optimizer that exchanges its own state (:class:`hgc.OnebitAdam <horovod_gradcomp.optim.OnebitAdam>`).

``opt = hgc.ddp.onebit_adam(ddp_model, lr=...)`` registers a comm hook that sends nothing
(each bucket is handed back as this rank's own gradient, so after ``backward()`` every rank
holds its local gradient) and returns an ``OnebitAdam`` whose exchange runs on a
:class:`~horovod_gradcomp.transports.torch_dist.TorchDistributedCommunicator` over DDP's ranks:
its ``step()`` averages the gradients (warm-up) or the momenta (1-bit) itself. The hook and the
optimizer are a pair: the hook alone would leave the ranks' models drifting apart, so it is
registered only here.
"""
from __future__ import annotations

import torch

from ..optim import OnebitAdam, OnebitAdamW
from ..transports.torch_dist import TorchDistributedCommunicator
from .arguments import refuse_options, require_ddp_model
from .gloo_exit import hold_backward_context


def _local_gradient(state, bucket):  # no annotations: DDP compares them to Future[Tensor] objects
    """DDP's bucket handed back untouched: each rank keeps its own gradient."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


def onebit_adam(ddp_model: torch.nn.parallel.DistributedDataParallel, *, decoupled: bool = False,
                group=None, **options) -> OnebitAdam:
    """Register the local-gradient hook on ``ddp_model`` and return an :class:`OnebitAdam`
    (``decoupled=True``: :class:`OnebitAdamW`) over its parameters; ``options`` go to it (lr,
    betas, eps, weight_decay, warmup_steps, scales, pattern, timeout). ``group``: the
    exchange's process group (None: a new gloo group over DDP's ranks, created here: call this
    on every rank at the same point). Step the returned optimizer after every ``backward()``."""
    require_ddp_model(ddp_model, "hgc.ddp.onebit_adam")
    refuse_options(options, ("communicator", "transport", "process_set", "bucket_bytes"), "hgc.ddp.onebit_adam",
                   "(the exchange runs on a torch.distributed group: pass group=)")
    import torch.distributed as dist
    if group is None:
        group = dist.new_group(ranks=dist.get_process_group_ranks(ddp_model.process_group), backend="gloo")
    named = [(n, p) for n, p in ddp_model.module.named_parameters() if p.requires_grad]
    cls = OnebitAdamW if decoupled else OnebitAdam
    optimizer = cls(named, communicator=TorchDistributedCommunicator(group), **options)
    ddp_model.register_comm_hook(None, _local_gradient)
    hold_backward_context(ddp_model)   # PyTorch 2.13's abort at exit on gloo: see gloo_exit.py
    return optimizer
