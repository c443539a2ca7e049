"""PyTorch DDP rows of ``bench exchange``: DDP with its PowerSGD communication hook (``ddp_powersgd:rank=R``)
or plain (``ddp``), on the gloo backend, in the same processes and harness run as the Horovod rows.

The ranks Horovod runs on also form a gloo process group (``torch.distributed``, TCP on the
harness's interface: ``lo`` for the loopback and ``none`` layouts, the rank's ``eth0`` on the
bridge), created once per process when the first DDP config is measured; Horovod's MPI and
gloo's sockets do not share anything, and configs run one after another, never at once.

One DDP step is the same as a Horovod row's: ``zero_grad()``, a backward that hands every
parameter its fixed gradient (the same ``InjectGrads`` function as the Horovod rows, as DDP's
module output), and ``SGD(lr=1e-9, momentum=0).step()``. The model is ONE DDP bucket
(``bucket_cap_mb`` above its size: on gloo the PowerSGD hook fails with a collective-size
mismatch when the model spans several buckets). PowerSGD starts compressing at iteration
``start_powerSGD_iter = 2`` (the least its error feedback allows); these rows run
``max(--warmup, 2)`` warm-up steps, so the timed ones all compress.

Bytes per rank per step: for PowerSGD, the ring allreduce of the values its hook counts as
allreduced (``PowerSGDState.total_numel_after_compression``: its P and Q factors and the tensors
it leaves uncompressed, fp32) over the timed steps; plain DDP's are COMPUTED from the shapes
(the ring allreduce of every gradient) and the row says so (``bytes_computed``).
"""
from __future__ import annotations

import socket
from typing import Sequence

from .timing import timed_steps

NAMES = ("ddp", "ddp_powersgd")
DEFAULT_ROWS = ("ddp_powersgd:rank=1", "ddp_powersgd:rank=4")


def is_ddp(name: str) -> bool:
    return name in NAMES


def available() -> bool:
    """Whether torch.distributed with gloo is there."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_gloo_available()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def ensure_group(hvd, net: str) -> None:
    """Create the gloo process group of Horovod's ranks once (rank 0 picks the port, Horovod
    broadcasts it)."""
    import os
    import torch.distributed as dist
    if dist.is_initialized():
        return
    from .slownet import bridge_address
    addr = bridge_address(0) if net == "bridge" else "127.0.0.1"
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "eth0" if net == "bridge" else "lo")
    port = hvd.broadcast_object(_free_port() if hvd.rank() == 0 else None, root_rank=0, name="hgc.ddp.port")
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}", rank=hvd.rank(), world_size=hvd.size())


def close_group() -> None:
    """Destroy the gloo group of :func:`ensure_group`, if any, while the process is still whole
    (not during interpreter shutdown, where gloo's threads were seen to abort the process)."""
    import gc
    import torch.distributed as dist
    if dist.is_initialized():
        gc.collect()          # the DDP models of the rows hold the group
        dist.destroy_process_group()


def time_ddp(hvd, cfg, shapes: Sequence, grads, steps: int, warmup: int, net: str, inject) -> dict:
    """Measure DDP config ``cfg`` (``ddp`` or ``ddp_powersgd`` with option ``rank``) on this rank:
    the same result keys as a Horovod config. ValueError for bad options."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    from .cost_model import powersgd_factor_bytes
    from .exchange_bench import LR

    opts = dict(cfg.options)
    rank = opts.pop("rank", None)
    if opts or (cfg.name == "ddp" and rank is not None):
        raise ValueError(f"{cfg.label}: unknown options {sorted(opts) or ['rank']}")
    if cfg.name == "ddp_powersgd" and (not isinstance(rank, int) or rank < 1):
        raise ValueError(f"{cfg.label}: ddp_powersgd needs rank=R, an integer >= 1")
    if cfg.name == "ddp_powersgd":
        warmup = max(warmup, 2)      # PowerSGD compresses from its iteration 2 on: time only those
    ensure_group(hvd, net)

    class Injected(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

        def forward(self):
            return inject.apply(grads, *self.params)

    module = Injected()
    model_mb = sum(p.numel() * p.element_size() for p in module.parameters()) / 2 ** 20
    ddp = DDP(module, bucket_cap_mb=2 * model_mb + 1)
    k = dist.get_world_size()
    ring = 2.0 * (k - 1) / k if k > 1 else 0.0
    dense = ring * 4 * sum(p.numel() for p in module.parameters())
    if cfg.name == "ddp_powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        sent = ring * powersgd_factor_bytes(shapes, rank)    # replaced by the hook's own count below
        factory = f"DDP(bucket_cap_mb={2 * model_mb + 1:.0f}) + powerSGD_hook(rank={rank}), gloo"
    else:
        sent = dense
        factory = f"DDP(bucket_cap_mb={2 * model_mb + 1:.0f}), gloo"
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.0)

    def step():
        opt.zero_grad()
        ddp().backward()
        opt.step()

    for _ in range(warmup):
        step()
    if cfg.name == "ddp_powersgd" and state.iter < state.start_powerSGD_iter:
        raise RuntimeError(f"{cfg.label}: PowerSGD is still at iteration {state.iter} after {warmup} warm-up steps "
                           f"(it compresses from {state.start_powerSGD_iter}): the timed steps would not compress")
    dist.barrier()
    counted0 = state.total_numel_after_compression if cfg.name == "ddp_powersgd" else 0
    out = dict(timed_steps(step, steps), factory=factory, bytes_sent=sent, bytes_dense=dense, bytes_computed=True)
    if cfg.name == "ddp_powersgd":   # the hook's own count of the values it allreduced (fp32)
        out["bytes_sent"] = ring * 4 * (state.total_numel_after_compression - counted0) / steps
        out["bytes_computed"] = False
    return out


__all__ = ["NAMES", "DEFAULT_ROWS", "available", "ensure_group", "is_ddp", "time_ddp"]
