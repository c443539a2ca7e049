"""The rows ``bench tta`` trains: how each one exchanges gradients, and its optimizer.

Row names:

* ``hvd:fp32``, ``hvd:fp16``: stock Horovod's allreduce through ``hgc.Compression.none()`` /
  ``.fp16()``; ``hvd:<codec>``: the codec's own factory at its defaults
  (``hgc.Compression.<codec>(named_parameters)``, no options);
* ``ddp:allreduce``: PyTorch DDP's own fp32 allreduce; ``ddp:powersgd1``, ``ddp:powersgd4``:
  its PowerSGD hook at rank 1 / 4 (``start_powerSGD_iter``: ``--powersgd-start``, 2 by default,
  as ``bench exchange``'s DDP rows; PyTorch's own default is 1000 plain allreduces first), the
  model in one DDP bucket (on gloo the hook fails with a collective-size mismatch when a model
  spans several buckets, as :mod:`.ddp_rows` notes; the other DDP rows keep DDP's buckets);
  ``ddp:<codec>``: this package's hook at the codec's defaults (``hgc.ddp.register(ddp, codec,
  optimizer=opt)``).

Optimizers (``sgd``: SGD with momentum; ``adamw``: AdamW), built on the parameters before the
exchange wraps them; the codecs take their Adam-aware defaults under AdamW and DGC takes the
SGD momentum over, as a user's script gets them. :data:`REFERENCE` is the row whose final loss
sets the target.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

#: The dense fp32 row: its final loss (+2%) is every row's target.
REFERENCE = "hvd:fp32"
OPTIMIZERS = ("sgd", "adamw")


def all_rows(codecs: Sequence[str]) -> List[str]:
    """Every row, Horovod's first: fp32, fp16, each codec; then DDP's allreduce, PowerSGD 1 and 4, each codec."""
    return (["hvd:fp32", "hvd:fp16"] + [f"hvd:{c}" for c in codecs]
            + ["ddp:allreduce", "ddp:powersgd1", "ddp:powersgd4"] + [f"ddp:{c}" for c in codecs])


def check_rows(rows: Sequence[str], codecs: Sequence[str]) -> List[str]:
    """``rows`` validated against :func:`all_rows` (ValueError naming the unknown ones or a
    missing :data:`REFERENCE`), duplicates dropped, in the order given."""
    known = all_rows(codecs)
    unknown = [r for r in rows if r not in known]
    if unknown:
        raise ValueError(f"unknown rows {unknown}; known: {', '.join(known)}")
    if REFERENCE not in rows:
        raise ValueError(f"the target is {REFERENCE}'s final loss: include the row {REFERENCE}")
    return list(dict.fromkeys(rows))


@dataclass(frozen=True)
class Hyper:
    """Learning rates and the rest of the optimizers' settings."""

    sgd_lr: float = 0.1
    momentum: float = 0.9
    adamw_lr: float = 3e-3
    weight_decay: float = 0.01
    powersgd_start: int = 2


def make_optimizer(name: str, params, hyper: Hyper):
    """``sgd``: SGD(lr, momentum); ``adamw``: AdamW(lr, weight_decay)."""
    import torch
    if name == "sgd":
        return torch.optim.SGD(params, lr=hyper.sgd_lr, momentum=hyper.momentum)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=hyper.adamw_lr, weight_decay=hyper.weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; known: {', '.join(OPTIMIZERS)}")


class Trainer:
    """One row's model, exchange and optimizer on this rank: :meth:`step` trains one minibatch,
    :attr:`module` is the bare model (for evaluation), :attr:`factory` says what was built."""

    def __init__(self, row: str, optimizer: str, model, hvd, net: str, hyper: Hyper):
        import torch
        import horovod_gradcomp as hgc
        kind, name = row.split(":", 1)
        self.module, self.factory = model, ""
        opt = make_optimizer(optimizer, model.parameters(), hyper)
        self._sync = None
        if kind == "hvd":
            if name in ("fp32", "fp16"):
                compression = hgc.Compression.none() if name == "fp32" else hgc.Compression.fp16()
            else:
                factory = getattr(hgc.Compression, name, None)
                compression = (factory(model.named_parameters()) if factory is not None
                               else hgc.Compression.codec(name, model.named_parameters()))
            self.opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                                compression=compression)
            hvd.broadcast_parameters(model.state_dict(), root_rank=0)
            hvd.broadcast_optimizer_state(self.opt, root_rank=0)
            self.forward = model
            made = {"fp32": "Compression.none()", "fp16": "Compression.fp16()"}.get(name, f"Compression.{name}(...)")
            self.factory = f"hvd.DistributedOptimizer({type(opt).__name__}, compression={made})"
        elif kind == "ddp":
            from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
            from torch.nn.parallel import DistributedDataParallel as DDP
            from ..ddp.gloo_exit import hold_backward_context
            from .ddp_rows import ensure_group
            ensure_group(hvd, net)
            if name.startswith("powersgd"):
                # one bucket, as bench exchange's PowerSGD rows: on gloo the hook fails with a collective
                # size mismatch when the model spans several buckets (DDP's default first bucket is 1 MiB)
                model_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2 ** 20
                ddp = DDP(model, bucket_cap_mb=2 * model_mb + 1)
            else:
                ddp = DDP(model)
            hold_backward_context(ddp)   # PyTorch 2.13 can abort gloo jobs at exit without it
            if name.startswith("powersgd"):
                rank = int(name[len("powersgd"):])
                state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                           start_powerSGD_iter=hyper.powersgd_start)
                ddp.register_comm_hook(state, psgd.powerSGD_hook)
                self.factory = f"DDP + powerSGD_hook(rank={rank}, start_powerSGD_iter={hyper.powersgd_start})"
            elif name != "allreduce":
                hgc.ddp.register(ddp, name, optimizer=opt)
                self.factory = f"DDP + hgc.ddp.register({name!r}, optimizer={type(opt).__name__})"
            else:
                self.factory = "DDP (its own allreduce)"
            self.opt, self.forward = opt, ddp
        else:
            raise ValueError(f"unknown row kind {kind!r} in {row!r}")
        self._torch = torch

    def step(self, seq) -> float:
        """One training step on ``seq`` ([batch, context + 1]); returns this rank's loss."""
        from .tta_model import lm_loss
        self.opt.zero_grad()
        loss = lm_loss(self.forward, seq)
        loss.backward()
        self.opt.step()
        return loss.item()

    def held_out_loss(self, held_out) -> float:
        """The bare model's loss on the held-out sequences (no communication)."""
        from .tta_model import lm_loss
        self.module.eval()
        with self._torch.no_grad():
            value = float(lm_loss(self.module, held_out))
        self.module.train()
        return value


def interleaved_points(trainers: Sequence[Trainer], streams, held_out, steps: int, eval_every: int,
                       barrier) -> List[List[dict]]:
    """Train every row ``steps`` steps, the rows taking turns one step at a time; return each
    row's ``[{"step", "seconds", "loss"}]``: the held-out loss at step 0, every ``eval_every``
    steps and at the end, against that row's training seconds so far.

    Taking turns is what makes the rows' seconds comparable on a machine whose load drifts: a
    busy minute slows a step of every row alike instead of one row's whole run. ``barrier()``
    lines the ranks up before each step, so a step's clock holds that row's step and nothing of
    the row before it; evaluation is off the clock."""
    import time
    points = [[{"step": 0, "seconds": 0.0, "loss": t.held_out_loss(held_out)}] for t in trainers]
    clocks = [0.0] * len(trainers)
    for step in range(1, steps + 1):
        for i, (trainer, stream) in enumerate(zip(trainers, streams)):
            barrier()
            t0 = time.perf_counter()
            trainer.step(next(stream))
            clocks[i] += time.perf_counter() - t0
            if step % eval_every == 0 or step == steps:
                points[i].append({"step": step, "seconds": clocks[i], "loss": trainer.held_out_loss(held_out)})
    return points


def row_label(row: str, optimizer: Optional[str] = None) -> str:
    """``hvd:onebit`` -> ``Horovod onebit``; with the optimizer appended when given."""
    kind, name = row.split(":", 1)
    text = f"{'Horovod' if kind == 'hvd' else 'DDP'} {name}"
    return f"{text} ({optimizer})" if optimizer else text


__all__ = ["Hyper", "OPTIMIZERS", "REFERENCE", "Trainer", "all_rows", "check_rows", "interleaved_points", "make_optimizer",
           "row_label"]
