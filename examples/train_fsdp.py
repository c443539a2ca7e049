"""A small transformer language model (next character of the stdlib's pydoc topics) sharded with
FSDP2, the codecs inside its reduce-scatter through ``hgc.fsdp.register``.

Run (4 processes on gloo, 1-bit SGD with error feedback):

    .venv/bin/torchrun --standalone --nproc_per_node 4 examples/train_fsdp.py --codec onebit --json

``--codec``: ``none`` (FSDP2's own dense reduce-scatter) or any name in ``hgc.available_codecs()``;
``--codec-opt KEY=VALUE`` passes options to the codec's factory (e.g. ``density=0.01``,
``bits=4``). ``--hsdp NODES``: FSDP2 shards over each of NODES groups of ranks and the codec
averages across the groups (HSDP mode). Every transformer block is its own ``fully_shard`` unit, then the whole model. With
``--ckpt-dir DIR`` saves model, optimizer and (sharded mode) compression state with
``torch.distributed.checkpoint`` at the end; ``--resume DIR`` loads them first (same world size). With
``--json`` rank 0 prints one JSON object as its last line: the losses, the test loss and, for a
codec, ``stats()`` (bytes sent per step against FSDP2's dense reduce-scatter of the same inputs).
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import horovod_gradcomp as hgc
from common import add_codec_args, load_text, parse_codec_args


class CharTransformer(nn.Module):
    """Token and position embeddings, ``layers`` causal pre-norm transformer blocks, a linear head;
    predicts the character after the context from the last position."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(context, width))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, dim_feedforward=4 * width, dropout=0.0, batch_first=True,
                                       norm_first=True) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(context), persistent=False)

    def forward(self, x):
        h = self.embed(x) + self.position[: x.shape[1]]
        for block in self.blocks:
            h = block(h, src_mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
        return self.head(self.norm(h[:, -1]))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_codec_args(p, "none (FSDP2's dense reduce-scatter) or a codec name")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-3 (adamw), 0.1 (sgd, momentum 0.9)")
    p.add_argument("--bf16", action="store_true", help="MixedPrecisionPolicy(bf16 parameters, fp32 reduce)")
    p.add_argument("--hsdp", type=int, default=0, metavar="NODES",
                   help="HSDP over NODES groups of ranks: FSDP2 shards inside each group, the codec between them "
                        "(with --codec none: FSDP2's own HSDP on the 2-D mesh)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default=None,
                   help="dcp.save model, optimizer and (sharded mode) compression state there at the end")
    p.add_argument("--resume", default=None, help="dcp.load a --ckpt-dir checkpoint before training (same world size)")
    p.add_argument("--json", action="store_true")
    return parse_codec_args(p, argv, ["none", *hgc.available_codecs()])


class Training:
    """Model and optimizer as one ``torch.distributed.checkpoint`` Stateful."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        model, optim = get_state_dict(self.model, self.opt)
        return {"model": model, "optim": optim}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def build(args, vocab: int) -> nn.Module:
    torch.manual_seed(args.seed)
    model = CharTransformer(vocab, args.context, args.width, args.heads, args.layers)
    mp = {"mp_policy": MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)} if args.bf16 \
        else {}
    if args.hsdp:
        from torch.distributed.device_mesh import init_device_mesh
        size = dist.get_world_size()
        if args.hsdp < 2 or size % args.hsdp:
            raise SystemExit(f"--hsdp {args.hsdp}: the {size} ranks must split into 2 or more equal groups")
        mesh = init_device_mesh("cpu", (args.hsdp, size // args.hsdp), mesh_dim_names=("replicate", "shard"))
        mp["mesh"] = mesh if args.codec == "none" else mesh["shard"]
    for block in model.blocks:
        fully_shard(block, **mp)
    fully_shard(model, **mp)
    return model


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    x_tr, y_tr, x_te, y_te, vocab = load_text(args.context)
    model = build(args, vocab)
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr or 3e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=args.lr or 0.1, momentum=0.9)
    state = None
    if args.codec != "none":
        state = hgc.fsdp.register(model, args.codec, optimizer=opt, **args.options)
    else:
        hgc.ddp.hold_backward_context(model)   # gloo's abort at exit (horovod_gradcomp/ddp/gloo_exit.py)
    start = torch.zeros(1, dtype=torch.int64)   # the steps already trained (the same on every rank)
    everything = {"training": Training(model, opt), "start": start}
    if state is not None and state.mode == "sharded":   # HSDP's state is not a DCP Stateful yet
        everything["compression"] = state
    if args.resume:
        dcp.load(everything, checkpoint_id=args.resume)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 7919 * int(start))
    losses, t0 = [], time.perf_counter()
    for step in range(args.steps):
        idx = torch.randint(0, len(x_tr), (args.batch_size,), generator=gen)
        loss = nn.functional.cross_entropy(model(x_tr[idx]).float(), y_tr[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    elapsed = time.perf_counter() - t0
    if args.ckpt_dir:
        start += args.steps
        dcp.save(everything, checkpoint_id=args.ckpt_dir)
    with torch.no_grad():   # every rank the same test windows; the full-size parameters are gathered by FSDP
        test = nn.functional.cross_entropy(model(x_te[:2048]).float(), y_te[:2048]).item()
    mean = torch.tensor(losses)
    dist.all_reduce(mean)
    hgc.ddp.keep_until_exit(mean)
    mean = (mean / size).tolist()
    result = {"codec": args.codec, "options": args.options, "world_size": size, "hsdp": args.hsdp,
              "optimizer": args.optimizer,
              "steps": args.steps, "first_loss": sum(mean[:10]) / 10, "last_loss": sum(mean[-20:]) / 20,
              "test_loss": test, "seconds": elapsed, "finite": all(map(math.isfinite, mean)),
              "parameters": sum(p.numel() for p in model.parameters()),
              "stats": None if state is None else state.stats()}
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{args.codec}: loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}, test {test:.3f}, "
                  f"{elapsed:.1f}s", flush=True)
            if state is not None:
                s = result["stats"]
                print(f"bytes sent per step {s['bytes_sent_per_step']:.0f} (FSDP2 dense: "
                      f"{s['bytes_dense_per_step']:.0f}), state {s['memory_bytes']} bytes", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
