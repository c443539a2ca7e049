"""Data-parallel training on scikit-learn's bundled digits with Horovod + gradient compression.

Run (2 ranks, 1-bit SGD with error feedback):

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python examples/train.py --codec onebit --json

``--codec`` takes ``none`` (Horovod's fp32 allreduce), ``fp16``, ``onebit-noef`` (onebit
without error feedback) or any name in ``hgc.available_codecs()``; ``--codec-opt KEY=VALUE``
passes options to that codec. The data (1797 8x8 images, 10 classes) ships with
scikit-learn: nothing is downloaded. Each rank trains on its shard (``rank::size``) of a
fixed stratified 80/20 split; at the end rank 0 evaluates the test set and every rank's
parameters are checked to be bitwise identical. With ``--json`` rank 0 prints one JSON
object as its last line of output; the exit status is 3 if parameters differ across ranks.
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from tqdm import tqdm

import horovod_gradcomp as hgc

DENSE = {"none": hgc.Compression.none, "fp16": hgc.Compression.fp16}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--codec", default="onebit",
                   help="none | fp16 | onebit-noef | any of hgc.available_codecs(): "
                        + ", ".join(hgc.available_codecs()))
    p.add_argument("--codec-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="option for the codec (repeatable); VALUE is a Python literal or a string")
    p.add_argument("--label", default=None, help="name of this run in the output (default: --codec)")
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (0: torch's default)")
    p.add_argument("--json", action="store_true", help="rank 0 prints a JSON summary as its last line")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when not a tty)")
    return p.parse_args(argv)


def make_compression(name, model, options, momentum):
    """none/fp16: Horovod's dense allreduce; onebit-noef: onebit without error feedback;
    anything else: the codec's own factory (hgc.Compression.<name>, with that codec's
    defaults) where there is one, else the registered codec of that name. dgc gets the
    momentum and the paper's 4-epoch density warm-up unless --codec-opt says otherwise."""
    if name in DENSE:
        if options:
            raise SystemExit(f"--codec {name} takes no --codec-opt")
        return DENSE[name]()
    if name == "onebit-noef":
        return hgc.Compression.onebit(model.named_parameters(), error_feedback=False, **options)
    if name == "dgc":  # DGC keeps the momentum itself (the optimizer below then has none)
        options = {"momentum": momentum, "warmup_length": 4, "warmup_unit": "epoch", **options}
    factory = getattr(hgc.Compression, name, None)
    if factory is not None:
        return factory(model.named_parameters(), **options)
    return hgc.Compression.codec(name, model.named_parameters(), **options)


def codec_options(pairs):
    opts = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--codec-opt expects KEY=VALUE, got {pair!r}")
        try:
            opts[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            opts[key] = value
    return opts


def load_data(seed):
    """Stratified 80/20 split of digits, standardized with the training statistics."""
    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x.astype(np.float32), y, test_size=0.2, stratify=y, random_state=seed)
    mean, std = x_tr.mean(0), x_tr.std(0)
    std[std == 0] = 1.0
    as_t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return (as_t((x_tr - mean) / std, torch.float32), as_t(y_tr, torch.long),
            as_t((x_te - mean) / std, torch.float32), as_t(y_te, torch.long))


def params_digest(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv=None):
    args = parse_args(argv)
    known = [*DENSE, "onebit-noef", *hgc.available_codecs()]
    if args.codec not in known:
        raise SystemExit(f"unknown --codec {args.codec!r}; choose one of {', '.join(known)}")
    label = args.label or args.codec
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    x_shard, y_shard = x_tr[rank::size], y_tr[rank::size]
    # Same number of steps on every rank (shards differ in size by at most one sample).
    steps = len(x_tr) // (size * args.batch_size)
    if steps == 0:
        raise SystemExit(f"--batch-size {args.batch_size} x {size} ranks exceeds the {len(x_tr)} training samples")

    model = nn.Sequential(nn.Linear(x_tr.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    compression = make_compression(args.codec, model, codec_options(args.codec_opt), args.momentum)
    # A compressor that owns the momentum (DGC) needs plain SGD underneath.
    own_momentum = isinstance(getattr(compression, "memory", None), hgc.DGCMemory)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.0 if own_momentum else args.momentum)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    bar = tqdm(total=args.epochs * steps, desc=label, file=sys.stderr, leave=False,
               disable=rank != 0 or args.no_progress or not sys.stderr.isatty())
    t0 = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        if hasattr(compression, "set_epoch"):
            compression.set_epoch(epoch)  # DGC's density warm-up counts epochs
        order = torch.randperm(len(x_shard), generator=gen)
        loss_sum = 0.0
        for i in range(steps):
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x_shard[idx]), y_shard[idx])
            loss.backward()
            optimizer.step()
            loss_sum += loss.item()
            bar.update()
        train_loss = hvd.allreduce(torch.tensor(loss_sum / steps), name=f"loss.{epoch}").item()
        bar.set_postfix(epoch=epoch + 1, loss=f"{train_loss:.4f}")
    seconds = time.perf_counter() - t0
    bar.close()

    digests = hvd.allgather_object(params_digest(model))
    identical = len(set(digests)) == 1
    stats = compression.stats()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        sent, dense = stats["bytes_sent_per_step"], stats["bytes_dense_per_step"]
        print(f"[{label}] {size} ranks, {args.epochs} epochs x {steps} steps: test accuracy {acc:.4f}, "
              f"train loss {train_loss:.4f}, {sent:,.0f} B/step sent vs {dense:,.0f} B/step dense "
              f"({stats['wire_ratio'] or float('nan'):.1f}x), {seconds:.1f} s, params identical across ranks: {identical}",
              flush=True)
        if args.json:
            print(json.dumps({
                "codec": label, "ranks": size, "epochs": args.epochs, "test_accuracy": acc,
                "train_loss": train_loss, "bytes_sent_per_step": sent, "bytes_dense_per_step": dense,
                "wire_ratio": stats["wire_ratio"], "payload_ratio": stats["payload_ratio"],
                "seconds": seconds, "params_identical": identical, "params_digest": digests[0],
                "transport": type(getattr(compression, "communicator", None)).__name__,
                "steps": stats["steps"], "batch_size": args.batch_size, "lr": args.lr,
                "momentum": args.momentum, "seed": args.seed,
            }), flush=True)
    hvd.shutdown()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
