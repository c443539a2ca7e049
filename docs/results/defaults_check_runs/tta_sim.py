"""K ranks of ``bench tta``'s transformer in one process, exchanging through the onebit codec.

The script behind defaults_check.md section 1b. Every step computes the K ranks' gradients on
their own shards and batches (``bench tta``'s sharding, batch streams, seed and model), encodes
each with its own error-feedback residual through the package's codec
(``hgc.get_codec("onebit", scales=..., residual_cap=...)``), averages the K decoded payloads as
the allgather pattern does and steps SGD (lr 0.1, momentum 0.9: ``bench tta``'s). ``--codec
none`` averages the exact gradients; ``--warmup N`` averages the first N steps exactly (onebit's
``warmup_steps``). Its dense held-out losses equal the harness's Horovod fp32 row to the printed
digits (2.2017, 1.9496, 1.7446 at steps 10, 20, 40). ``--optimizer adamw`` steps AdamW (lr 3e-3,
weight decay 0.01: ``bench tta``'s) instead; ``--horovod-start`` first does what
``hvd.broadcast_optimizer_state`` does to an optimizer without state (every gradient zero, one
``step()``: AdamW's step count then starts at 1 and its weight decay is applied once), which
the DDP rows never do: with ``--codec none`` it ends at the Horovod fp32 row's loss and without it
at DDP's allreduce row's (guide/time_to_accuracy.md). Prints the held-out loss every ``--eval``
steps, then one JSON line.

    PYTHONPATH=. .venv/bin/python docs/results/defaults_check_runs/tta_sim.py --cap 0.05 --steps 150 --eval 25
    PYTHONPATH=. .venv/bin/python docs/results/defaults_check_runs/tta_sim.py --codec none --optimizer adamw \
        --steps 25 --eval 5 [--horovod-start]
"""
import argparse
import json
import time

import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.bench.tta_data import batches, load
from horovod_gradcomp.bench.tta_model import SIZES, CharTransformer, lm_loss
from horovod_gradcomp.bench.tta_rows import Hyper, make_optimizer

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--k", type=int, default=4)
p.add_argument("--steps", type=int, default=60)
p.add_argument("--codec", choices=("onebit", "none"), default="onebit")
p.add_argument("--cap", type=float, default=1.0, help="onebit's residual_cap")
p.add_argument("--scales", default="rows")
p.add_argument("--warmup", type=int, default=0, help="the first N steps averaged exactly")
p.add_argument("--lr", type=float, default=0.1)
p.add_argument("--mom", type=float, default=0.9)
p.add_argument("--eval", type=int, default=10)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
p.add_argument("--horovod-start", action="store_true", help="one zero-gradient step first")
a = p.parse_args()
torch.set_num_threads(1)
shape = SIZES["small"]
datas = [load(shape.context, r, a.k) for r in range(a.k)]
torch.manual_seed(0)
model = CharTransformer(datas[0].vocab, shape)
params = list(model.parameters())
opt = make_optimizer(a.optimizer, params, Hyper(sgd_lr=a.lr, momentum=a.mom))   # AdamW: bench tta's settings
if a.horovod_start:
    for q in params:
        q.grad = torch.zeros_like(q)
    opt.step()
codec = None if a.codec == "none" else hgc.get_codec("onebit", scales=a.scales, residual_cap=a.cap)
res = [[torch.zeros_like(q) for q in params] for _ in range(a.k)]
streams = [batches(datas[r], a.batch, r) for r in range(a.k)]   # bench tta's seeds: seed 0 * 1000 + rank


def held():
    model.eval()
    with torch.no_grad():
        v = float(lm_loss(model, datas[0].held_out))
    model.train()
    return v


out = {"args": vars(a), "points": [(0, held())]}
t0 = time.time()
for step in range(1, a.steps + 1):
    grads = []
    for r in range(a.k):
        opt.zero_grad()
        lm_loss(model, next(streams[r])).backward()
        grads.append([q.grad.detach().clone() for q in params])
    for i, q in enumerate(params):
        if codec is None or step <= a.warmup:
            q.grad = sum(g[i] for g in grads) / a.k
        else:
            dec = [codec.decode(codec.encode(grads[r][i].contiguous(), res[r][i])) for r in range(a.k)]
            q.grad = (sum(dec) / a.k).view_as(q)
    opt.step()
    if step % a.eval == 0 or step == a.steps:
        out["points"].append((step, held()))
        print(step, out["points"][-1][1], f"{time.time() - t0:.0f}s", flush=True)
print(json.dumps(out))
