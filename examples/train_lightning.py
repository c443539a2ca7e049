"""The digits task of examples/train.py as a LightningModule, the codec in a DDP comm hook.

Run (2 CPU processes, gloo, 1-bit SGD with error feedback):

    .venv/bin/python examples/train_lightning.py --codec onebit --json

``--codec none`` trains with Lightning's plain ``strategy="ddp"`` (DDP's dense allreduce);
any name of ``hgc.available_codecs()`` uses
``horovod_gradcomp.integrations.lightning.CompressedDDPStrategy``; ``--codec-opt KEY=VALUE``
passes options to the codec. ``--ckpt-dir DIR``: Lightning's ``ModelCheckpoint`` writes
``DIR/epoch=E.ckpt`` after every epoch (with every rank's compression state);
``--resume CKPT`` continues from one up to ``--epochs``.
Lightning starts the second process itself (it re-runs this script). With ``--json`` rank 0
prints one JSON object as its last line; the exit status is 3 if parameters differ across ranks.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

import horovod_gradcomp as hgc
from horovod_gradcomp.integrations.lightning import CompressedDDPStrategy
from common import add_codec_args, all_gather_digests, load_data, params_digest, parse_codec_args


class DigitsMLP(L.LightningModule):
    """examples/train.py's digits model: 64 -> hidden -> ReLU -> 10, SGD."""

    def __init__(self, hidden=128, lr=0.05, momentum=0.9, optimizer="sgd"):
        super().__init__()
        self.lr, self.momentum, self.optimizer_name = lr, momentum, optimizer
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self):
        if self.optimizer_name == "adam":   # the codecs take their Adam defaults (docs/guide/adam.md)
            return torch.optim.Adam(self.parameters(), lr=self.lr)
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_codec_args(p, "none | " + " | ".join(hgc.available_codecs()))
    p.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd",
                   help="torch.optim.SGD (with --momentum) or torch.optim.Adam")
    p.add_argument("--devices", type=int, default=2, help="CPU processes")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per process")
    p.add_argument("--ckpt-dir", metavar="DIR", help="a checkpoint per epoch here (ModelCheckpoint)")
    p.add_argument("--resume", metavar="CKPT", help="continue from this checkpoint")
    p.add_argument("--json", action="store_true", help="rank 0 prints a JSON summary as its last line")
    return parse_codec_args(p, argv, ["none", *hgc.available_codecs()])


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    L.seed_everything(args.seed, verbose=False)
    x_tr, y_tr, x_te, y_te = load_data(args.seed)
    # Lightning gives each process its shard (a DistributedSampler, reshuffled every epoch).
    loader = DataLoader(TensorDataset(x_tr, y_tr), batch_size=args.batch_size, shuffle=True)

    momentum = args.momentum
    if args.codec == "none":
        strategy = "ddp"
    else:
        options = dict(args.options)
        if args.codec == "dgc":  # DGC keeps the momentum itself: the optimizer gets none
            options = {"momentum": momentum, "warmup_length": 4, "warmup_unit": "epoch", **options}
            momentum = 0.0
        strategy = CompressedDDPStrategy(args.codec, codec_options=options)
    model = DigitsMLP(args.hidden, args.lr, momentum, args.optimizer)
    if args.codec == "none":  # plain DDP; the codec's strategy does this itself
        hgc.ddp.hold_backward_context(model)   # PyTorch 2.13 can abort gloo jobs at exit without it
    callbacks = [ModelCheckpoint(dirpath=args.ckpt_dir, filename="{epoch}", save_top_k=-1)] if args.ckpt_dir else []
    trainer = L.Trainer(accelerator="cpu", devices=args.devices, strategy=strategy, max_epochs=args.epochs,
                        logger=False, callbacks=callbacks, enable_checkpointing=bool(callbacks),
                        enable_progress_bar=False, enable_model_summary=False)
    t0 = time.perf_counter()
    trainer.fit(model, loader, ckpt_path=args.resume)
    seconds = time.perf_counter() - t0

    state = getattr(trainer.strategy, "compression_state", None)
    stats = state.stats() if state is not None else {}
    digests = all_gather_digests(params_digest(model))
    identical = len(set(digests)) == 1
    if trainer.is_global_zero:
        model.eval()
        with torch.no_grad():
            acc = (model(x_te).argmax(1) == y_te).float().mean().item()
        label = f"lightning-{args.codec}"
        print(f"[{label}] {trainer.world_size} processes, {trainer.current_epoch} epochs, {trainer.global_step} steps: "
              f"test accuracy {acc:.4f}, {seconds:.1f} s, params identical across ranks: {identical}", flush=True)
        if args.json:
            print(json.dumps({
                "codec": label, "ranks": trainer.world_size, "epochs": trainer.current_epoch,
                "global_step": trainer.global_step, "test_accuracy": acc, "params_identical": identical,
                "params_digest": digests[0], "seconds": seconds, "hook_steps": stats.get("steps"),
                "bytes_sent_per_step": stats.get("bytes_sent_per_step"),
                "bytes_dense_per_step": stats.get("bytes_dense_per_step"), "wire_ratio": stats.get("wire_ratio"),
                "optimizer": args.optimizer,
                "adam_defaults_taken": dict(state.compression.adapted_options) if state is not None else None,
            }), flush=True)
    return 0 if identical else 3


if __name__ == "__main__":
    sys.exit(main())
