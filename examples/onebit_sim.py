"""K ranks of ``train.py --task charlm`` in one process, exchanging through the onebit (or DGC) codec.

For studying onebit's training dynamics quickly (one process, no MPI; a 4-epoch run takes
about a minute on one core where the real -np 4 run takes several): every step computes the K
ranks' gradients on their own shards and batches (``train.py``'s sharding, batch order and
seeds), encodes each with its own error-feedback residual through the package's codec
(``hgc.get_codec("onebit", scales=..)``), averages the K decoded payloads as the allgather
pattern does, applies the opt-in gradient warm-up (:func:`horovod_gradcomp.exchange.step_ramp.ramp_factor`)
and steps the optimizer (SGD with momentum, or ``--optimizer``). ``--codec none`` averages the
exact gradients instead; ``--codec dgc`` runs DGC as it runs under Adam (no momentum correction:
each rank adds its gradient to its accumulation, sends the top ``--density`` of it, zeroes what
it sent; ``--density-warmup`` its density warm-up in steps).
``--optimizer-warmup N`` is the script's own learning-rate schedule (the same for every codec);
``--residual-cap C`` is onebit's ``residual_cap`` option (``--cap-groups tensor``: a per-tensor
cap applied here instead, as ``--residual-decay``, remedies tried outside the codec). A run whose
last 50 steps average a train loss above ``--abort-loss`` stops early as diverged.

It is a model of the exchange, not the exchange: the sum runs in float64 in rank order here,
so its results match ``train.py``'s to rounding, not bitwise, and its perplexities land within
a few percent of the real runs' (docs/results/onebit_divergence.md compares them). Use
``train.py`` under mpirun for figures that claim what the package does.

    .venv/bin/python examples/onebit_sim.py --ranks 4 --scales rows --lr-warmup-steps 300
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn.functional as F

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.step_ramp import ramp_factor
from horovod_gradcomp.state.dgc_memory import DensitySchedule
from common import load_text, shard
from train import CharRNN, lm_loss, make_optimizer, next_chars


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4, help="K, the simulated ranks")
    p.add_argument("--codec", choices=("onebit", "dgc", "none"), default="onebit")
    p.add_argument("--density", type=float, default=0.1, help="dgc: the density after the warm-up")
    p.add_argument("--density-warmup", type=int, default=0, metavar="STEPS",
                   help="dgc: the density falls from 0.25 to --density over the first STEPS steps (DGC's warm-up)")
    p.add_argument("--scales", choices=("columns", "rows"), default="columns", help="onebit's scale groups")
    p.add_argument("--lr-warmup-steps", type=int, default=0, help="onebit's lr_warmup_steps (the averaged "
                   "gradient of step t < N times (t + 1) / N)")
    p.add_argument("--warmup-steps", type=int, default=0, help="the first N steps averaged exactly")
    p.add_argument("--optimizer-warmup", type=int, default=0,
                   help="the script's own learning-rate schedule: lr * (t + 1) / N for t < N, for every codec")
    p.add_argument("--residual-cap", type=float, default=0.0,
                   help="after each encode, scale a residual down to at most C times its gradient's norm")
    p.add_argument("--cap-groups", choices=("codec", "tensor"), default="codec",
                   help="--residual-cap per group of the codec (its residual_cap option) or per tensor (here)")
    p.add_argument("--residual-decay", type=float, default=1.0, help="residual multiplied by D after each encode")
    p.add_argument("--abort-loss", type=float, default=8.0,
                   help="stop early (diverged) when the mean train loss of the last 50 steps exceeds this")
    p.add_argument("--log", default=None, help="append the JSON result to this file")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--lr", type=float, default=0.5)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--optimizer", choices=("sgd", "adam", "adamw"), default="sgd", help="as train.py's --optimizer")
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=128, help="the GRU's width (train.py's --hidden)")
    p.add_argument("--stride", type=int, default=16, help="a training window every STRIDE characters")
    p.add_argument("--impl", choices=("native", "reference"), default="native", help="the codec's implementation")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def limit_residual(residual, grad, cap, decay):
    """Residual remedies tried here and not in the codec: ``residual`` scaled down in place to at
    most ``cap`` times the norm of ``grad`` (the whole tensor; 0: not), then by ``decay``."""
    if cap > 0:
        rn, gn = residual.norm(), grad.norm()
        if rn > cap * gn:
            residual.mul_(cap * gn / rn)
    if decay != 1.0:
        residual.mul_(decay)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_tr, y_tr, x_te, y_te, vocab = load_text(32, train_stride=args.stride)
    k = args.ranks
    shards = [shard(x_tr, y_tr, r, k, args.batch_size) for r in range(k)]
    steps = shards[0][2]
    model = CharRNN(vocab, hidden=args.hidden)
    params = list(model.named_parameters())
    opt = make_optimizer(args.optimizer, model.parameters(), args.lr, args.momentum, args.weight_decay)
    in_codec = args.cap_groups == "codec"
    if args.codec == "dgc":   # momentum-free DGC (its form under Adam): accumulate, send the top, zero what was sent
        codec = hgc.get_codec("dgc", impl=args.impl, density=args.density)
        schedule = DensitySchedule(args.density, length=args.density_warmup, unit="step")
    else:
        codec = hgc.get_codec("onebit", impl=args.impl, scales=args.scales,
                              residual_cap=args.residual_cap if in_codec else 0.0)
    residuals = [{n: torch.zeros_like(p) for n, p in params} for _ in range(k)]
    gens = [torch.Generator().manual_seed(args.seed * 1000 + r) for r in range(k)]
    t0, losses, recent, diverged = time.perf_counter(), [], [], False
    for epoch in range(args.epochs):
        if diverged:
            break
        orders = [torch.randperm(len(x), generator=g) for (x, _, _), g in zip(shards, gens)]
        total = 0.0
        for i in range(steps):
            step = epoch * steps + i
            step_loss = 0.0
            summed = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in params}
            for r, (x, y, _) in enumerate(shards):
                idx = orders[r][i * args.batch_size:(i + 1) * args.batch_size]
                model.zero_grad()
                loss = lm_loss(model, x[idx], y[idx])
                loss.backward()
                total += loss.item() / k
                step_loss += loss.item() / k
                for n, p in params:
                    if args.codec == "none" or step < args.warmup_steps:
                        summed[n] += p.grad
                    elif args.codec == "dgc":
                        acc = residuals[r][n]
                        acc.add_(p.grad)
                        payload, sent = codec.encode_with_indices(acc, density=schedule.density(step))
                        summed[n] += codec.decode(payload).view_as(acc)
                        acc.view(-1).index_fill_(0, sent.long(), 0)
                    else:
                        summed[n] += codec.decode(codec.encode(p.grad, residual=residuals[r][n]))
                        limit_residual(residuals[r][n], p.grad, 0.0 if in_codec else args.residual_cap,
                                       args.residual_decay)
            factor = ramp_factor(args.lr_warmup_steps, step) if args.codec == "onebit" else 1.0
            for n, p in params:
                p.grad = (summed[n] / k * factor).to(p.dtype)
            if args.optimizer_warmup:
                for group in opt.param_groups:
                    group["lr"] = args.lr * min(1.0, (step + 1) / args.optimizer_warmup)
            opt.step()
            recent = (recent + [step_loss])[-50:]
            if not math.isfinite(step_loss) or (len(recent) == 50 and sum(recent) / 50 > args.abort_loss):
                diverged = True
                print(f"step {step}: mean train loss of the last 50 steps {sum(recent) / len(recent):.3g}: "
                      "diverged, stopping", file=sys.stderr)
                break
        losses.append(total / (i + 1))
        print(f"epoch {epoch + 1}: train loss {losses[-1]:.4f} ({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    model.eval()
    with torch.no_grad():
        logits = model(x_te)
        test_loss = F.cross_entropy(logits.reshape(-1, vocab), next_chars(x_te, y_te).reshape(-1)).item()
    result = {"ranks": k, "codec": args.codec, "scales": args.scales, "density": args.density,
              "density_warmup": args.density_warmup, "lr_warmup_steps": args.lr_warmup_steps,
              "warmup_steps": args.warmup_steps, "optimizer_warmup": args.optimizer_warmup,
              "residual_cap": args.residual_cap, "cap_groups": args.cap_groups, "residual_decay": args.residual_decay,
              "epochs": args.epochs, "steps_per_epoch": steps, "lr": args.lr, "optimizer": args.optimizer,
              "weight_decay": args.weight_decay, "seed": args.seed, "train_loss": losses,
              "diverged": diverged, "test_loss": test_loss if not diverged else math.inf,
              "perplexity": math.exp(min(test_loss, 700.0)) if not diverged else math.inf,
              "seconds": time.perf_counter() - t0}
    print(json.dumps(result))
    if args.log:
        with open(args.log, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
