"""PyTorch DDP rows of ``bench exchange``, on the gloo backend, in the same processes and harness run
as the Horovod rows:

* ``ddp``: DDP's own allreduce (fp32); ``ddp_fp16``: its ``fp16_compress_hook``;
* ``ddp_powersgd:rank=R``: its PowerSGD hook;
* ``ddp_<codec>[:options]`` (e.g. ``ddp_onebit``, ``ddp_dgc:density=0.001``): this package's hook
  (``hgc.ddp.register(ddp, codec, **options)``: one exchange per DDP bucket as DDP hands it over;
  ``per_bucket=False``: one exchange per step).

The ranks Horovod runs on also form a gloo process group (``torch.distributed``, TCP on the
harness's interface: ``lo`` for the loopback and ``none`` layouts, the rank's ``eth0`` on the
bridge), created once per process when the first DDP config is measured; Horovod's MPI and
gloo's sockets do not share anything, and configs run one after another, never at once.

Two kinds of step (``--ddp-backward``):

* ``inject`` (default): the same step as a Horovod row's: ``zero_grad()``, a backward that hands
  every parameter its fixed gradient (the ``InjectGrads`` function, as DDP's module output), and
  ``SGD(lr=1e-9, momentum=0).step()``; the model is ONE DDP bucket (``bucket_cap_mb`` above its
  size), so no exchange can overlap backward;
* ``resnet50``: a real ResNet-50 (:mod:`horovod_gradcomp.bench.resnet`) forward and backward on
  ``--ddp-batch`` random images of ``--ddp-image`` pixels square and random labels, then the same
  SGD step; DDP's default buckets (25 MB), no buffer sync in forward, so buckets' exchanges can
  overlap the rest of backward. PowerSGD alone keeps one bucket: on gloo its hook fails with a
  collective-size mismatch when the model spans several buckets (its callbacks issue collectives
  in an order that differs between ranks).

PowerSGD starts compressing at iteration ``start_powerSGD_iter = 2`` (the least its error feedback
allows); every DDP row runs ``max(--warmup, 2)`` warm-up steps (DDP also rebuilds its buckets after
the first), so the timed ones all compress.

Bytes per rank per step: for PowerSGD, the ring allreduce of the values its hook counts as
allreduced (``PowerSGDState.total_numel_after_compression``: its P and Q factors and the tensors
it leaves uncompressed, fp32) over the timed steps; for this package's hook, its ``stats()``
(``bytes_sent`` plus the ``padding_bytes`` of variable-size parts); plain DDP's and fp16's are
COMPUTED from the shapes (the ring allreduce of every gradient at 4 or 2 bytes a value) and the
row says so (``bytes_computed``).
"""
from __future__ import annotations

import json
import socket
from typing import Sequence

from .timing import LR, timed_steps

NAMES = ("ddp", "ddp_fp16", "ddp_powersgd")
DEFAULT_ROWS = ("ddp_powersgd:rank=1", "ddp_powersgd:rank=4")
BACKWARDS = ("inject", "resnet50")


def hgc_codec(name: str):
    """The codec of a ``ddp_<codec>`` config (this package's hook), or None."""
    if not name.startswith("ddp_") or name in NAMES:
        return None
    import horovod_gradcomp as hgc
    codec = name[len("ddp_"):]
    return codec if codec in hgc.available_codecs() else None


def is_ddp(name: str) -> bool:
    return name in NAMES or hgc_codec(name) is not None


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


def add_worker_arguments(parser, net_use: str) -> None:
    """The options every harness worker gets from its bench: ``--net`` (the harness layout,
    ``net_use`` saying what the worker needs it for), ``--rate`` (a label for the rows) and
    ``--json`` (where rank 0 writes them, :func:`close_worker`)."""
    parser.add_argument("--net", required=True, help=f"the harness layout (for {net_use})")
    parser.add_argument("--rate", required=True, help="the link rate, a label for the rows")
    parser.add_argument("--json", required=True)


def close_worker(rank: int, path: str, rows: list) -> int:
    """A harness worker's end: :func:`close_group`, then rank 0 writes ``rows`` to ``path`` as
    JSON; the worker's exit status (0)."""
    close_group()
    if rank == 0:
        with open(path, "w") as f:
            json.dump(rows, f)
    return 0


def _module(backward: str, shapes: Sequence, grads, inject, batch: int, image: int):
    """(module, step input function) of a DDP row: the injected-gradient module or a ResNet-50."""
    import torch
    if backward == "resnet50":
        from .resnet import resnet50
        module = resnet50()
        gen = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
        x = torch.randn(batch, 3, image, image, generator=gen)
        y = torch.randint(0, 1000, (batch,), generator=gen)
        return module, lambda ddp: torch.nn.functional.cross_entropy(ddp(x), y)

    class Injected(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.params = torch.nn.ParameterList([torch.nn.Parameter(torch.zeros(s)) for s in shapes])

        def forward(self):
            return inject.apply(grads, *self.params)

    return Injected(), lambda ddp: ddp()


def time_ddp(hvd, cfg, shapes: Sequence, grads, steps: int, warmup: int, net: str, inject,
             backward: str = "inject", batch: int = 8, image: int = 64) -> dict:
    """Measure DDP config ``cfg`` (see the module doc) on this rank: the same result keys as a
    Horovod config. ValueError for bad options."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
    from .cost_model import powersgd_factor_bytes

    if backward not in BACKWARDS:
        raise ValueError(f"--ddp-backward must be one of {BACKWARDS}, got {backward!r}")
    opts = dict(cfg.options)
    codec = hgc_codec(cfg.name)
    rank = None if codec else opts.pop("rank", None)
    if not codec and (opts or (cfg.name != "ddp_powersgd" and rank is not None)):
        raise ValueError(f"{cfg.label}: unknown options {sorted(opts) or ['rank']}")
    if cfg.name == "ddp_powersgd" and (not isinstance(rank, int) or rank < 1):
        raise ValueError(f"{cfg.label}: ddp_powersgd needs rank=R, an integer >= 1")
    warmup = max(warmup, 2)      # PowerSGD compresses from its iteration 2 on; DDP rebuilds buckets after 1
    ensure_group(hvd, net)
    module, loss = _module(backward, shapes, grads, inject, batch, image)
    params = list(module.parameters())
    model_mb = sum(p.numel() * p.element_size() for p in params) / 2 ** 20
    one_bucket = backward == "inject" or cfg.name == "ddp_powersgd"
    cap = 2 * model_mb + 1 if one_bucket else 25
    import inspect                   # no buffer sync in forward (the flag was renamed in torch 2.13)
    no_sync = ("forward_sync_buffers" if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
               else "broadcast_buffers")
    ddp = DDP(module, bucket_cap_mb=cap, **{no_sync: False})
    from ..ddp.gloo_exit import hold_backward_context
    hold_backward_context(ddp)   # every row, the baselines' hooks too: PyTorch 2.13 can abort gloo jobs at exit
    k = dist.get_world_size()
    ring = 2.0 * (k - 1) / k if k > 1 else 0.0
    numel = sum(p.numel() for p in params)
    dense = ring * 4 * numel
    sent, where = dense, f"DDP(bucket_cap_mb={cap:.0f}"
    where += ", ResNet-50 forward+backward on %dx3x%dx%d)" % (batch, image, image) if backward == "resnet50" else ")"
    state = None
    if cfg.name == "ddp_powersgd":
        state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=2)
        ddp.register_comm_hook(state, psgd.powerSGD_hook)
        sent = ring * powersgd_factor_bytes([tuple(p.shape) for p in params], rank)   # replaced below
        factory = f"{where} + powerSGD_hook(rank={rank}), gloo"
    elif cfg.name == "ddp_fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        sent = ring * 2 * numel
        factory = f"{where} + fp16_compress_hook, gloo"
    elif codec:
        import horovod_gradcomp as hgc
        state = hgc.ddp.register(ddp, codec, **opts)
        factory = (f"{where} + hgc.ddp.register({codec!r}{''.join(f', {k}={v!r}' for k, v in opts.items())}), "
                   f"gloo, {'per bucket' if state.per_bucket else 'one exchange per step'}")
    else:
        factory = f"{where}, gloo"
    opt = torch.optim.SGD(params, lr=LR, momentum=0.0)

    def step():
        opt.zero_grad()
        loss(ddp).backward()
        opt.step()

    for _ in range(warmup):
        step()
    if cfg.name == "ddp_powersgd" and state.iter < state.start_powerSGD_iter:
        raise RuntimeError(f"{cfg.label}: PowerSGD is still at iteration {state.iter} after {warmup} warm-up steps "
                           f"(it compresses from {state.start_powerSGD_iter}): the timed steps would not compress")
    dist.barrier()
    counted0 = state.total_numel_after_compression if cfg.name == "ddp_powersgd" else 0
    before = state.stats() if codec else None
    out = dict(timed_steps(step, steps), factory=factory, bytes_sent=sent, bytes_dense=dense, bytes_computed=True)
    if cfg.name == "ddp_powersgd":   # the hook's own count of the values it allreduced (fp32)
        out["bytes_sent"] = ring * 4 * (state.total_numel_after_compression - counted0) / steps
        out["bytes_computed"] = False
    elif codec:                      # the hook's own counts, padding of variable-size parts included
        after = state.stats()
        out["bytes_sent"] = (after["bytes_sent"] - before["bytes_sent"]
                             + after["padding_bytes"] - before["padding_bytes"]) / steps
        out["bytes_dense"] = (after["bytes_dense"] - before["bytes_dense"]) / steps
        out["bytes_computed"] = False
    return out


__all__ = ["BACKWARDS", "NAMES", "DEFAULT_ROWS", "available", "ensure_group", "hgc_codec", "is_ddp", "time_ddp"]
