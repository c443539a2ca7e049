"""The digits example of examples/train.py on PyTorch DDP, the codecs in a DDP comm hook.

Run (2 processes on gloo, 1-bit SGD with error feedback):

    .venv/bin/torchrun --standalone --nproc_per_node 2 examples/train_ddp.py --codec onebit --json

``--codec``: ``none`` (DDP's own allreduce, no hook), ``powersgd`` (DDP's PowerSGD hook,
rank 2), ``onebit-noef`` or any name in ``hgc.available_codecs()`` (through
``hgc.ddp.register``); ``--codec-opt KEY=VALUE`` passes options to the codec. Same model,
data split, shards and schedule as examples/train.py, so accuracies compare with the
Horovod runs. With ``--json`` rank 0 prints one JSON object as its last line; the exit
status is 3 if parameters differ across ranks.
"""
from __future__ import annotations

import gc
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import horovod_gradcomp as hgc
from common import all_gather_digests, check_codec, codec_options, digits_setup, params_digest, train_epoch
from train import parse_args

BASELINES = ("none", "powersgd")


def attach(name, ddp, options, momentum, optimizer):
    """Register the exchange for --codec on the DDP model; return the hgc state or None. The
    optimizer is passed along so that the codec takes its optimizer-aware defaults from the
    first step on (as hvd.DistributedOptimizer does)."""
    if name == "none":
        return None
    if name == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=options.get("rank", 2),
                                       start_powerSGD_iter=options.get("start_iter", 10))
        ddp.register_comm_hook(state, powersgd.powerSGD_hook)
        return None
    if name == "onebit-noef":
        return hgc.ddp.register(ddp, "onebit", error_feedback=False, optimizer=optimizer, **options)
    if name == "dgc":
        options = {"momentum": momentum, "warmup_length": 4, "warmup_unit": "epoch", **options}
    return hgc.ddp.register(ddp, name, optimizer=optimizer, **options)


def main(argv=None):
    args = parse_args(argv)
    check_codec(args.codec, [*BASELINES, "onebit-noef", *hgc.available_codecs()])
    label = args.label or f"ddp-{args.codec}"
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, x_shard, y_shard, steps, x_te, y_te = digits_setup(args.seed, args.hidden, rank, size, args.batch_size)
    # One DDP bucket: DDP's PowerSGD hook on gloo fails across several (see DESIGN.md).
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=64 if args.codec == "powersgd" else 25)
    own_momentum = args.codec == "dgc"   # DGC applies the momentum itself (momentum correction)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.0 if own_momentum else args.momentum)
    state = attach(args.codec, ddp, codec_options(args.codec_opt), args.momentum, optimizer)
    if state is None:  # DDP's allreduce or one of PyTorch's hooks; hgc.ddp.register does this itself
        hgc.ddp.hold_backward_context(ddp)   # PyTorch 2.13 can abort gloo jobs at exit without it
    assert own_momentum == (state is not None and isinstance(state.compression.memory, hgc.DGCMemory))

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    t0 = time.perf_counter()
    ddp.train()
    for epoch in range(args.epochs):
        if state is not None:
            state.set_epoch(epoch)
        loss_sum = train_epoch(ddp, optimizer, x_shard, y_shard, steps, args.batch_size, gen)
        mean_loss = torch.tensor(loss_sum / steps)
        dist.all_reduce(mean_loss)
        hgc.ddp.keep_until_exit(mean_loss)   # one small tensor an epoch: see all_gather_digests
        train_loss = mean_loss.item() / size
    seconds = time.perf_counter() - t0

    digests = all_gather_digests(params_digest(model))
    identical = len(set(digests)) == 1
    stats = state.stats() if state is not None else {}
    if rank == 0:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        print(f"[{label}] {size} ranks, {args.epochs} epochs x {steps} steps: test accuracy {acc:.4f}, "
              f"train loss {train_loss:.4f}, {seconds:.1f} s, params identical across ranks: {identical}", flush=True)
        if args.json:
            print(json.dumps({
                "codec": label, "ranks": size, "epochs": args.epochs, "test_accuracy": acc, "train_loss": train_loss,
                "bytes_sent_per_step": stats.get("bytes_sent_per_step"),
                "bytes_dense_per_step": stats.get("bytes_dense_per_step"), "wire_ratio": stats.get("wire_ratio"),
                "seconds": seconds, "params_identical": identical, "params_digest": digests[0],
                "steps": stats.get("steps"),
            }), flush=True)
    # DDP's reducer (and a codec hook's state) hold the process group: release them before the
    # group is destroyed, not during interpreter shutdown (where gloo's threads were seen to abort).
    del ddp, state, optimizer
    gc.collect()
    dist.destroy_process_group()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
