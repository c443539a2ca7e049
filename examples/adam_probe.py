"""Why a codec loses under Adam: one process, K simulated ranks, the char model of train.py,
the same batches and initial model for every variant; torch's Adam on the mean of the K ranks'
decoded payloads (the package's codecs, each rank with its own residual / accumulation).

For each variant it prints, after ``--steps`` steps: the mean train loss of the last 20 steps,
the sum of Adam's second moment (exp_avg_sq) over all parameters divided by dense's (what
the quantization noise does to Adam's denominator), the parameters' displacement from the
start divided by dense's (how far Adam moved them), and the bytes sent per rank and step.

    .venv/bin/python examples/adam_probe.py --steps 150 --ranks 2

It is a model of the exchange (the mean summed here in rank order), not the exchange: the
table in docs/results/adam_table.md runs train.py under mpirun.
"""
from __future__ import annotations

import argparse
import json

import torch

import horovod_gradcomp as hgc
from common import load_text, shard
from train import CharRNN, lm_loss

# name: (codec, codec options, error feedback, dgc density or None)
VARIANTS = {
    "dense": (None, {}, False, None),
    "onebit": ("onebit", {}, True, None),
    "qsgd": ("qsgd", {"norm": "max"}, False, None),
    "terngrad": ("terngrad", {}, False, None),
    "terngrad-clip2.5": ("terngrad", {"clip": 2.5}, False, None),
    "terngrad-clip1.5": ("terngrad", {"clip": 1.5}, False, None),
    "terngrad-clip1.0": ("terngrad", {"clip": 1.0}, False, None),
    "terngrad-clip0.5": ("terngrad", {"clip": 0.5}, False, None),
    "terngrad-clip0.25": ("terngrad", {"clip": 0.25}, False, None),
    "terngrad-clip2.0": ("terngrad", {"clip": 2.0}, False, None),
    "terngrad-ef": ("terngrad", {}, True, None),
    "dgc-0.001": ("dgc", {}, False, 0.001),
    "dgc-0.01": ("dgc", {}, False, 0.01),
    "dgc-0.05": ("dgc", {}, False, 0.05),
    "dgc-0.1": ("dgc", {}, False, 0.1),
}


def run(variant, steps, k, lr, seed, data):
    codec_name, opts, ef, density = VARIANTS[variant]
    x_tr, y_tr, vocab = data
    torch.manual_seed(seed)
    model = CharRNN(vocab)
    start = [p.detach().clone() for p in model.parameters()]
    named = list(model.named_parameters())
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    shards = [shard(x_tr, y_tr, r, k, 32) for r in range(k)]
    codecs = [hgc.get_codec(codec_name, **opts, **({"rank_stream": r} if codec_name in ("terngrad", "qsgd", "dgc")
                                                   else {}), **({"density": density} if density else {}))
              for r in range(k)] if codec_name else None
    memory = [{n: torch.zeros_like(p) for n, p in named} for _ in range(k)]   # residual or DGC accumulation
    gens = [torch.Generator().manual_seed(seed * 1000 + r) for r in range(k)]
    orders = [torch.randperm(len(x), generator=g) for (x, _, _), g in zip(shards, gens)]
    losses, sent = [], 0
    for t in range(steps):
        grads = []
        for r, (x, y, _) in enumerate(shards):
            idx = orders[r][t * 32:(t + 1) * 32]
            model.zero_grad()
            loss = lm_loss(model, x[idx], y[idx])
            loss.backward()
            losses.append(loss.item())
            grads.append({n: p.grad.detach().clone() for n, p in named})
        for n, p in named:
            if codecs is None:
                p.grad = torch.stack([g[n] for g in grads]).mean(0)
                continue
            scale = max(c.local_scale(g[n] + (memory[r][n] if ef else 0)) for r, (c, g) in
                        enumerate(zip(codecs, grads))) if codec_name == "terngrad" else None
            decoded = []
            for r in range(k):
                v = grads[r][n] + memory[r][n] if (ef or density) else grads[r][n]
                payload = codecs[r].encode(v, scale=scale) if scale is not None else codecs[r].encode(v)
                sent += payload.nbytes
                out = codecs[r].decode(payload)
                if ef or density:   # EF residual, or DGC's accumulation minus what was sent
                    memory[r][n] = v - out
                decoded.append(out)
            p.grad = torch.stack(decoded).to(torch.float64).mean(0).to(p.dtype)
        opt.step()
    v_sum = sum(float(opt.state[p]["exp_avg_sq"].sum()) for p in model.parameters())
    moved = float(torch.sqrt(sum(((p.detach() - s) ** 2).sum() for p, s in zip(model.parameters(), start))))
    return {"variant": variant, "ranks": k, "steps": steps, "loss_last20": sum(losses[-20 * k:]) / (20 * k),
            "adam_v_sum": v_sum, "displacement": moved, "payload_bytes_per_rank_step": sent / max(steps * k, 1)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    x_tr, y_tr, _, _, vocab = load_text(32, train_stride=16)
    rows = [run(v, args.steps, args.ranks, args.lr, args.seed, (x_tr, y_tr, vocab)) for v in args.variants.split(",")]
    dense = next((r for r in rows if r["variant"] == "dense"), None)
    for r in rows:
        if dense:
            r["v_ratio"] = r["adam_v_sum"] / dense["adam_v_sum"]
            r["displacement_ratio"] = r["displacement"] / dense["displacement"]
        print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
