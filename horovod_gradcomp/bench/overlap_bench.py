"""``python -m horovod_gradcomp.bench overlap``: does the bucket thread overlap the exchange
with backward? Run it under mpirun (e.g. inside ``ci/slownet.sh``).

One step on every rank: forward and backward of an MLP (``--layers`` square layers of width
``--width``, batch ``--batch``; real compute on the CPU) through stock
``hvd.DistributedOptimizer``, then ``step()``. Configs, side by side in one run, each
after the previous one finished:

* ``compute``: the same forward/backward and a local SGD step, no exchange at all;
* ``sync``: the codec with one exchange at ``synchronize()`` (``bucket_bytes=None``);
* ``buckets``: buckets of ``--bucket-mb`` MB with ``overlap=False`` (exchanged at
  ``synchronize()``, in order);
* ``thread``: the same buckets with ``overlap=True`` (a communication thread exchanges each
  bucket as soon as its gradients are in, during the rest of backward).

Prints a table and, last, one JSON object: per config the median ms per step over
``--steps`` (after ``--warmup``; the slowest rank's), and ``hidden_ms = sync - thread`` (how
much of the exchange the thread hid). With one core per rank, compute and the thread's
encode compete for the same core: only the time spent waiting on the network can hide.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

COMMAND = "overlap"
HELP = "ms per step of a real MLP step with the exchange at synchronize() vs from the bucket thread"
CONFIGS = ("compute", "sync", "buckets", "thread")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--codec", default="onebit", help="codec name (options: name:key=value,...)")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")


def _parse(spec: str):
    name, _, rest = spec.partition(":")
    opts = {}
    for pair in filter(None, rest.split(",")):
        key, _, val = pair.partition("=")
        try:
            import ast
            opts[key] = ast.literal_eval(val)
        except (ValueError, SyntaxError):
            opts[key] = val
    return name, opts


def _time_config(config: str, args, hvd, hgc, torch) -> float:
    torch.manual_seed(0)
    layers = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    named = list(model.named_parameters())
    opt = torch.optim.SGD(model.parameters(), lr=1e-6)
    if config != "compute":
        name, opts = _parse(args.codec)
        if config != "sync":
            opts.update(bucket_bytes=int(args.bucket_mb * (1 << 20)), overlap=config == "thread")
        factory = getattr(hgc.Compression, name, None)
        comp = factory(named, **opts) if factory else hgc.Compression.codec(name, named, **opts)
        opt = hvd.DistributedOptimizer(opt, named_parameters=named, compression=comp)
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(hvd.rank()))
    times = []
    for i in range(args.warmup + args.steps):
        hvd.allreduce(torch.zeros(1), name=f"barrier.{config}.{i}")
        t0 = time.perf_counter()
        opt.zero_grad()
        model(x).pow(2).mean().backward()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= args.warmup:
            times.append(float(hvd.allreduce(torch.tensor([dt]), op=hvd.Max, name=f"t.{config}.{i}")))
    return 1e3 * statistics.median(times)


def run(args: argparse.Namespace) -> int:
    import horovod.torch as hvd
    import torch

    import horovod_gradcomp as hgc
    hvd.init()
    torch.set_num_threads(args.threads)
    result = {"codec": args.codec, "k": hvd.size(), "width": args.width, "layers": args.layers,
              "batch": args.batch, "bucket_mb": args.bucket_mb}
    for config in CONFIGS:
        result[f"{config}_ms"] = round(_time_config(config, args, hvd, hgc, torch), 2)
    result["hidden_ms"] = round(result["sync_ms"] - result["thread_ms"], 2)
    if hvd.rank() == 0:
        for config in CONFIGS:
            print(f"{config:>8}: {result[config + '_ms']:9.2f} ms/step")
        print(json.dumps(result), flush=True)
    sys.stdout.flush()
    return 0
