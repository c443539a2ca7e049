"""The digits task of examples/train.py with Hugging Face Accelerate, the codec in a DDP comm hook.

Run (2 CPU processes, gloo, 1-bit SGD with error feedback):

    .venv/bin/accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no examples/train_accelerate.py --codec onebit --json

(no GPU: Accelerate then runs the processes on the CPU over gloo; ``torchrun --nproc_per_node 2``
works as well). ``--codec none``: DDP's dense allreduce, no hook; any name of
``hgc.available_codecs()``: ``horovod_gradcomp.integrations.accelerate.register`` on the
prepared model; ``--codec-opt KEY=VALUE`` passes options to the codec. ``--ckpt-dir DIR`` runs
``accelerator.save_state(DIR/epoch_E)`` after every epoch E (with every rank's compression
state); ``--resume DIR/epoch_E`` loads one and continues up to ``--epochs``. With ``--json`` rank 0 prints one
JSON object as its last line; the exit status is 3 if parameters differ across ranks.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset

import horovod_gradcomp as hgc
from horovod_gradcomp.integrations import accelerate as hgc_accelerate
from common import add_codec_args, all_gather_digests, load_data, params_digest, parse_codec_args


class Progress:
    """Epochs done, saved and restored by ``accelerator.save_state``/``load_state``."""

    def __init__(self):
        self.epoch = 0

    def state_dict(self):
        return {"epoch": self.epoch}

    def load_state_dict(self, state):
        self.epoch = state["epoch"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_codec_args(p, "none | " + " | ".join(hgc.available_codecs()))
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--ckpt-dir", metavar="DIR", help="accelerator.save_state(DIR/epoch_E) after every epoch")
    p.add_argument("--resume", metavar="DIR", help="accelerator.load_state(DIR), then continue")
    p.add_argument("--json", action="store_true", help="rank 0 prints a JSON summary as its last line")
    return parse_codec_args(p, argv, ["none", *hgc.available_codecs()])


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    # A seedable sampler: each epoch's order is a function of (seed, epoch), so a resumed run
    # sees the batches the uninterrupted one would have.
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    set_seed(args.seed)
    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
    options, momentum = dict(args.options), args.momentum
    if args.codec == "dgc":  # DGC keeps the momentum itself: the optimizer gets none
        options = {"momentum": momentum, "warmup_length": 4, "warmup_unit": "epoch", **options}
        momentum = 0.0
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=momentum)
    loader = DataLoader(TensorDataset(x_tr, y_tr), batch_size=args.batch_size, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)

    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    state = None if args.codec == "none" else hgc_accelerate.register(accelerator, model, args.codec, **options)
    if state is None:  # plain DDP; the codec's hook does this itself
        hgc.ddp.hold_backward_context(model)   # PyTorch 2.13 can abort gloo jobs at exit without it
    if args.resume:
        accelerator.load_state(args.resume)

    t0 = time.perf_counter()
    model.train()
    steps = 0
    for epoch in range(progress.epoch, args.epochs):
        loader.set_epoch(epoch)
        if state is not None:
            state.set_epoch(epoch)  # DGC's warm-up counts epochs
        for x, y in loader:
            optimizer.zero_grad()
            accelerator.backward(F.cross_entropy(model(x), y))
            optimizer.step()
            steps += 1
        progress.epoch = epoch + 1
        if args.ckpt_dir:  # every process calls it; rank 0 writes
            accelerator.save_state(os.path.join(args.ckpt_dir, f"epoch_{progress.epoch}"))
    seconds = time.perf_counter() - t0

    net = accelerator.unwrap_model(model)
    digests = all_gather_digests(params_digest(net))
    identical = len(set(digests)) == 1
    stats = state.stats() if state is not None else {}
    if accelerator.is_main_process:
        net.eval()
        with torch.no_grad():
            acc = (net(x_te).argmax(1) == y_te).float().mean().item()
        label = f"accelerate-{args.codec}"
        print(f"[{label}] {accelerator.num_processes} processes ({accelerator.distributed_type}), epochs "
              f"{progress.epoch}, {steps} steps this run: test accuracy {acc:.4f}, {seconds:.1f} s, "
              f"params identical across ranks: {identical}", flush=True)
        if args.json:
            print(json.dumps({
                "codec": label, "ranks": accelerator.num_processes,
                "distributed_type": str(accelerator.distributed_type), "epochs": progress.epoch, "steps": steps, "test_accuracy": acc, "params_identical": identical,
                "params_digest": digests[0], "seconds": seconds, "hook_steps": stats.get("steps"),
                "bytes_sent_per_step": stats.get("bytes_sent_per_step"),
                "bytes_dense_per_step": stats.get("bytes_dense_per_step"), "wire_ratio": stats.get("wire_ratio"),
            }), flush=True)
    accelerator.end_training()
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
