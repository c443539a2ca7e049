"""Lightning's FSDP2 strategy with a codec on 2 CPU processes (Lightning starts the second one).

    python tests/lightning_fsdp_worker.py CODEC STEPS [--save DIR] [--resume DIR]

Rank 0 prints one JSON line: the losses of every step (mean over ranks), the compression stats and a
digest of this rank's parameter shards. CODEC "none": ModelParallelStrategy without a codec.
"""
from __future__ import annotations

import argparse
import hashlib
import json

import lightning as L
import torch
from torch.distributed.fsdp import fully_shard

import horovod_gradcomp as hgc


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 9), torch.nn.Tanh(), torch.nn.Linear(9, 5))
        self.losses = []

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.net[0], mesh=mesh)
        fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.detach().clone())
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def data(steps: int = 3):
    """``steps`` batches of 16 per rank and epoch (2 ranks)."""
    g = torch.Generator().manual_seed(1234)
    a, b = torch.randn(16, 12, generator=g) / 4, torch.randn(12, 5, generator=g)
    x = torch.randn(steps * 2 * 16, 16, generator=g)
    return torch.utils.data.TensorDataset(x, torch.tanh(x @ a) @ b)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("codec")
    ap.add_argument("steps", type=int)
    ap.add_argument("--save")
    ap.add_argument("--resume")
    args = ap.parse_args()
    kw = dict(data_parallel_size=2, tensor_parallel_size=1)
    if args.codec == "none":
        strategy = L.pytorch.strategies.ModelParallelStrategy(**kw)
    else:
        from horovod_gradcomp.integrations.lightning_fsdp import CompressedModelParallelStrategy
        strategy = CompressedModelParallelStrategy(args.codec, **kw)
    model = Model()
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    loader = torch.utils.data.DataLoader(data(), batch_size=16, shuffle=False)
    trainer.fit(model, loader, ckpt_path=args.resume)
    if args.save:
        trainer.save_checkpoint(args.save)
    losses = torch.stack(model.losses) if model.losses else torch.zeros(0)
    torch.distributed.all_reduce(losses)
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.to_local().detach().numpy().tobytes())
    digest = torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8).clone()
    every = [torch.empty_like(digest) for _ in range(2)]
    torch.distributed.all_gather(every, digest)
    hgc.ddp.keep_until_exit(losses, digest, *every)
    state = getattr(strategy, "compression_state", None)
    if trainer.global_rank == 0:
        print(json.dumps({"ok": True, "losses": (losses / 2).tolist(),
                          "digests": [bytes(e.tolist()).hex() for e in every],
                          "step": None if state is None else state.step,
                          "memory_bytes": None if state is None else state.memory_bytes(),
                          "stats": None if state is None else state.stats()}, default=str), flush=True)


if __name__ == "__main__":
    main()
