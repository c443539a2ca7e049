"""Why ``bench tta``'s Horovod fp32 and DDP allreduce rows end apart under AdamW (same bytes, same data).

K ranks of ``bench tta``'s transformer in one process, exact gradient averaging, AdamW (lr 3e-3,
weight decay 0.01: ``bench tta``'s). ``--horovod-start`` first does what
``hvd.broadcast_optimizer_state`` does to an optimizer without state: every gradient set to zero
and one ``step()``, so AdamW's step count starts at 1 (a different bias correction for every
later step) and its weight decay is applied once. The DDP rows never do that. Prints the held-out
loss every ``--eval`` steps, then one JSON line.

    PYTHONPATH=. .venv/bin/python docs/results/defaults_check_runs/tta_adamw_start.py --steps 25 --eval 5
    PYTHONPATH=. .venv/bin/python docs/results/defaults_check_runs/tta_adamw_start.py --steps 25 --eval 5 --horovod-start
"""
import argparse
import json

import torch

from horovod_gradcomp.bench.tta_data import batches, load
from horovod_gradcomp.bench.tta_model import SIZES, CharTransformer, lm_loss

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--k", type=int, default=4)
p.add_argument("--steps", type=int, default=25)
p.add_argument("--eval", type=int, default=5)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--horovod-start", action="store_true", help="one zero-gradient step first")
a = p.parse_args()
torch.set_num_threads(1)
shape = SIZES["small"]
datas = [load(shape.context, r, a.k) for r in range(a.k)]
torch.manual_seed(0)
model = CharTransformer(datas[0].vocab, shape)
params = list(model.parameters())
opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01)
if a.horovod_start:
    for q in params:
        q.grad = torch.zeros_like(q)
    opt.step()
streams = [batches(datas[r], a.batch, r) for r in range(a.k)]


def held():
    model.eval()
    with torch.no_grad():
        v = float(lm_loss(model, datas[0].held_out))
    model.train()
    return v


points = [(0, held())]
for step in range(1, a.steps + 1):
    total = [torch.zeros_like(q) for q in params]
    for r in range(a.k):
        model.zero_grad()
        lm_loss(model, next(streams[r])).backward()
        for t, q in zip(total, params):
            t += q.grad
    for t, q in zip(total, params):
        q.grad = t / a.k
    opt.step()
    if step % a.eval == 0 or step == a.steps:
        points.append((step, held()))
        print(f"step {step}: held-out loss {points[-1][1]:.4f}", flush=True)
print(json.dumps({"args": vars(a), "points": points}))
