"""Pick the minibatch size on an initial slice of the digits data (Seide et al.'s rule).

    .venv/bin/python examples/minibatch_select.py --json

Each candidate size trains the same fresh MLP (as in examples/train.py) for ``--epochs``
passes over the first ``--slice`` fraction of the training set, with a per-sample learning
rate (lr = ``--lr-per-sample`` x size) and SGD momentum; the objective is the mean
cross-entropy on that slice afterwards. The largest size within ``--tolerance`` (relative)
of the best objective is kept. One process; with ``--json`` the last line is one JSON object
(the choice and the objective per candidate).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import load_data  # noqa: E402  (the same split and scaling as the demo)

from horovod_gradcomp.training.minibatch import select_minibatch_size, slice_trial  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--candidates", default="4,8,16,32,64,128,256", help="comma-separated sizes")
    p.add_argument("--slice", type=float, default=0.5, help="fraction of the training set tried on")
    p.add_argument("--epochs", type=int, default=3, help="passes over the slice per candidate")
    p.add_argument("--lr-per-sample", type=float, default=0.05 / 32)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--tolerance", type=float, default=0.05, help="relative: objective <= best * (1 + tol)")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print the result as a JSON object, last")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(1)
    x_tr, y_tr, _, _ = load_data(args.seed)
    n = max(1, int(len(x_tr) * args.slice))
    data = (x_tr[:n], y_tr[:n])

    def make_model():
        torch.manual_seed(args.seed)
        return nn.Sequential(nn.Linear(x_tr.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))

    trial = slice_trial(make_model, lambda ps, lr: torch.optim.SGD(ps, lr=lr, momentum=args.momentum),
                        F.cross_entropy, data, lr_per_sample=args.lr_per_sample, epochs=args.epochs, seed=args.seed)
    candidates = [int(c) for c in args.candidates.split(",") if c.strip()]
    choice = select_minibatch_size(trial, candidates, tolerance=args.tolerance)
    print(f"slice: first {n} of {len(x_tr)} training samples, {args.epochs} epochs, lr = "
          f"{args.lr_per_sample:.3g} x size, momentum {args.momentum}")
    for size, value in choice.objective.items():
        mark = "  <- chosen" if size == choice.size else ("" if value <= choice.allowed else "  (hurts)")
        print(f"  minibatch {size:5d}: objective {value:.4f}{mark}")
    print(f"chosen minibatch size: {choice.size} (best objective {choice.best:.4f}, allowed <= {choice.allowed:.4f})")
    if args.json:
        print(json.dumps({"slice_samples": n, **choice.as_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
