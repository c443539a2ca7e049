"""Per-layer probe of a compressed exchange over the first steps of ``train.py``'s models.

Run under mpirun, e.g. (4 ranks, the char model at train.py's defaults):

    mpirun --allow-run-as-root --oversubscribe -np 4 .venv/bin/python examples/onebit_probe.py \
        --task charlm --codec onebit --steps 150 --out /tmp/probe.jsonl

Each step trains exactly as ``train.py`` does (same model, data shards, SGD with momentum,
``hvd.DistributedOptimizer``) and records, for every parameter:

* ``g``: norm of rank 0's local gradient; ``mean``: norm of the exact (fp32) mean over ranks;
* ``res``: norm of the averaged gradient the compression returned, ``err``: its relative
  error ``|res - mean| / |mean|``;
* ``r``: norm of rank 0's error-feedback residual after the step (0 without one), ``owner``:
  norm of its two-phase owner residuals of that parameter;
* ``d_max``: max |reconstruction value| rank 0 sent for it (its decoded payload is
  ``g + r_before - r_after``), ``ghost``: max |decoded value| on rows whose local gradient is
  all zero (e.g. embedding rows of characters absent from the batch), ``zero_rows``: how many;
* ``w``: parameter norm after the step, ``upd``: norm of the step's parameter change.

Rank 0 prints a table of chosen steps and, given ``--baseline`` (the ``--out`` file of a
reference run, e.g. ``--codec none``), per layer the first step where its parameter norm
exceeded ``--blowup`` times the reference's at that step; ``--out`` writes one JSON object per step.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd

import horovod_gradcomp as hgc
from common import load_data, load_text, shard
from train import CharRNN, codec_options, lm_loss, make_compression


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=("charlm", "digits"), default="charlm")
    p.add_argument("--codec", default="onebit", help="as train.py: none | fp16 | onebit-noef | a codec name")
    p.add_argument("--codec-opt", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--lr", type=float, default=None, help="default: train.py's (charlm 0.5, digits 0.05)")
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--baseline", default=None, help="--out file of a reference run (e.g. --codec none)")
    p.add_argument("--blowup", type=float, default=2.0,
                   help="a layer 'blows up' at the first step where |w| > BLOWUP x the baseline's |w|")
    p.add_argument("--show", default="0,1,2,3,5,10,20,50,100,150,200,300,500",
                   help="steps shown in the table (comma-separated)")
    p.add_argument("--out", default=None, help="rank 0 writes one JSON object per step here")
    args = p.parse_args(argv)
    if args.lr is None:
        args.lr = 0.5 if args.task == "charlm" else 0.05
    return args


def _norm(t: torch.Tensor) -> float:
    return float(t.detach().double().norm())


def main(argv=None) -> int:
    args = parse_args(argv)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if args.task == "charlm":
        x_tr, y_tr, _, _, vocab = load_text(32)
        model, loss_fn = CharRNN(vocab, hidden=args.hidden), lm_loss
    else:
        x_tr, y_tr, _, _ = load_data(args.seed)
        model = nn.Sequential(nn.Linear(x_tr.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
        loss_fn = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    x_shard, y_shard, steps_per_epoch = shard(x_tr, y_tr, rank, size, args.batch_size)
    compression = make_compression(args.codec, model, codec_options(args.codec_opt), args.momentum)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum),
                                         named_parameters=model.named_parameters(), compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    named = list(model.named_parameters())
    memory = getattr(compression, "memory", None)
    residuals = getattr(memory, "residuals", {})
    owner = getattr(getattr(compression, "state", None), "owner_memory", None)
    local = {}
    for n, p in named:  # the local gradient, before Horovod's hook may reduce .grad in place (dense)
        p.register_hook(lambda g, n=n: local.__setitem__(n, g.detach().clone()))
    baseline = [json.loads(line) for line in open(args.baseline)] if args.baseline else []
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    order = torch.randperm(len(x_shard), generator=gen)
    records, blowup = [], {}
    for step in range(args.steps):
        i = step % steps_per_epoch
        if i == 0 and step:
            order = torch.randperm(len(x_shard), generator=gen)
        idx = order[i * args.batch_size:(i + 1) * args.batch_size]
        optimizer.zero_grad()
        loss = loss_fn(model, x_shard[idx], y_shard[idx])
        loss.backward()
        r_before = {n: (residuals[n].clone() if n in residuals else torch.zeros_like(p)) for n, p in named}
        before = {n: p.detach().clone() for n, p in named}
        optimizer.synchronize()
        result = {n: p.grad.detach().clone() for n, p in named}
        with optimizer.skip_synchronize():
            optimizer.step()
        rec = {"step": step, "loss": hvd.allreduce(loss.detach(), name="probe.loss").item(), "layers": {}}
        for n, p in named:
            mean = hvd.allreduce(local[n], name=f"probe.{n}")  # exact mean, outside the compression
            r_after = residuals[n] if n in residuals else torch.zeros_like(p)
            decoded = local[n] + r_before[n] - r_after
            rows = local[n].reshape(local[n].shape[0], -1) if local[n].dim() > 1 else local[n].reshape(-1, 1)
            zero = (rows == 0).all(1)
            ghost = decoded.reshape(rows.shape)[zero]
            own = [v for k, v in (owner.residuals.items() if owner is not None else ()) if k.startswith(n + "[")]
            m = _norm(mean)
            rec["layers"][n] = {
                "g": _norm(local[n]), "mean": m, "res": _norm(result[n]),
                "err": _norm(result[n] - mean) / m if m else 0.0, "r": _norm(r_after),
                "owner": math.sqrt(sum(_norm(v) ** 2 for v in own)), "d_max": float(decoded.abs().max()),
                "ghost": float(ghost.abs().max()) if ghost.numel() else 0.0, "zero_rows": int(zero.sum()),
                "w": _norm(p), "upd": _norm(p.detach() - before[n])}
            ref = baseline[step]["layers"][n]["w"] if step < len(baseline) else None
            if ref is not None and n not in blowup and not rec["layers"][n]["w"] <= args.blowup * ref:
                blowup[n] = step
        records.append(rec)
    if rank == 0:
        show = {int(s) for s in args.show.split(",")}
        print(f"probe: {args.task}, codec {args.codec} {args.codec_opt}, {size} ranks, lr {args.lr}, "
              f"momentum {args.momentum}, {args.steps} steps")
        cols = ("g", "mean", "res", "err", "r", "owner", "d_max", "ghost", "zero_rows", "w", "upd")
        print(f"{'step':>5} {'loss':>9} {'layer':<16}" + "".join(f"{c:>10}" for c in cols))
        for rec in records:
            if rec["step"] not in show:
                continue
            for n, v in rec["layers"].items():
                print(f"{rec['step']:>5} {rec['loss']:>9.4g} {n:<16}" + "".join(
                    f"{v[c]:>10d}" if isinstance(v[c], int) else f"{v[c]:>10.3g}" for c in cols))
        if baseline:
            print(f"first step with |w| > {args.blowup:g} x the baseline's |w| at that step: "
                  + (", ".join(f"{n} {s}" for n, s in sorted(blowup.items(), key=lambda kv: kv[1])) or "none"))
        if args.out:
            with open(args.out, "w") as f:
                for rec in records:
                    f.write(json.dumps(rec) + "\n")
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
