"""A small transformer language model (next character of the stdlib's pydoc topics) sharded with
FSDP2, the codecs inside its reduce-scatter through ``hgc.fsdp.register``.

Run (4 processes on gloo, 1-bit SGD with error feedback):

    .venv/bin/torchrun --standalone --nproc_per_node 4 examples/train_fsdp.py --codec onebit --json

``--codec``: ``none`` (FSDP2's own dense reduce-scatter) or any name in ``hgc.available_codecs()``;
``--codec-opt KEY=VALUE`` passes options to the codec's factory (e.g. ``density=0.01``,
``bits=4``). ``--hsdp NODES``: FSDP2 shards over each of NODES groups of ranks and the codec
averages across the groups (HSDP mode). Every transformer block is its own ``fully_shard`` unit, then the whole model. With
``--ckpt-dir DIR`` saves model, optimizer and compression state (sharded or HSDP mode) with
``torch.distributed.checkpoint`` at the end; ``--resume DIR`` loads them first (same world size).
``--cosine-steps T`` decays the lr along a cosine to 0 at training step T. With ``--json`` rank 0
prints one JSON object as its last line: the losses, the test loss and, for a codec, ``stats()``
(bytes sent per step against FSDP2's dense reduce-scatter of the same inputs).
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


def steps_count(text: str) -> int:
    """argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def training_parser(description: str, codec_help: str) -> argparse.ArgumentParser:
    """The options of the language model's training run (model size, steps, optimizer, seed,
    ``--json``, ``--codec``), which examples/train_lm_ddp.py shares."""
    p = argparse.ArgumentParser(description=description)
    add_codec_args(p, codec_help)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--optimizer", choices=("sgd", "adamw"), default="adamw")
    p.add_argument("--lr", type=float, default=None, help="default: 3e-3 (adamw), 0.1 (sgd, momentum 0.9)")
    p.add_argument("--cosine-steps", type=steps_count, default=0, metavar="T",
                   help="lr follows a cosine from --lr down to 0 over the training's steps 0..T (counted across "
                        "--resume; 0, the default: a constant lr)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true")
    return p


def cosine_lr(base: float, step: int, total: int) -> float:
    """The lr at training step ``step`` of a cosine from ``base`` (step 0) to 0 (step ``total``
    and after); ``total == 0``: ``base`` at every step."""
    if total <= 0:
        return base
    return base * 0.5 * (1.0 + math.cos(math.pi * min(step, total) / total))


def set_cosine_lr(opt, step: int, total: int) -> None:
    """Every param group's lr at ``step`` of :func:`cosine_lr` from the optimizer's constructed lr
    (``opt.defaults``: a ``--resume`` restores the groups' decayed lr, not the base)."""
    for group in opt.param_groups:
        group["lr"] = cosine_lr(opt.defaults["lr"], step, total)


def parse_args(argv=None):
    p = training_parser(__doc__.split("\n\n")[0], "none (FSDP2's dense reduce-scatter) or a codec name")
    p.add_argument("--bf16", action="store_true", help="MixedPrecisionPolicy(bf16 parameters, fp32 reduce)")
    p.add_argument("--hsdp", type=int, default=0, metavar="NODES",
                   help="HSDP over NODES groups of ranks: FSDP2 shards inside each group, the codec between them "
                        "(with --codec none: FSDP2's own HSDP on the 2-D mesh)")
    p.add_argument("--ckpt-dir", default=None,
                   help="dcp.save model, optimizer and compression state there at the end")
    p.add_argument("--resume", default=None, help="dcp.load a --ckpt-dir checkpoint before training (same world size)")
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


def make_optimizer(args, params):
    """AdamW(lr 3e-3) or SGD(lr 0.1, momentum 0.9) unless ``--lr`` says otherwise."""
    if args.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=args.lr or 3e-3)
    return torch.optim.SGD(params, lr=args.lr or 0.1, momentum=0.9)


def train(model, opt, args, x_tr, y_tr, rank: int, start: int = 0):
    """``args.steps`` steps on this rank's minibatches (drawn from a generator seeded by the seed,
    the rank and ``start``, the steps already trained); returns (the losses, the seconds taken)."""
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank + 7919 * int(start))
    losses, t0 = [], time.perf_counter()
    for step in range(args.steps):
        if args.cosine_steps:
            set_cosine_lr(opt, int(start) + step, args.cosine_steps)
        idx = torch.randint(0, len(x_tr), (args.batch_size,), generator=gen)
        loss = nn.functional.cross_entropy(model(x_tr[idx]).float(), y_tr[idx])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, time.perf_counter() - t0


def summarize(args, model, losses, elapsed: float, x_te, y_te, **extra) -> dict:
    """The run's result on every rank (a collective): the training losses averaged over the ranks
    (first 10 and last 20 steps), the test loss on 2,048 held-out windows, and ``extra``."""
    with torch.no_grad():   # every rank the same test windows (FSDP gathers the full-size parameters)
        test = nn.functional.cross_entropy(model(x_te[:2048]).float(), y_te[:2048]).item()
    mean = torch.tensor(losses)
    dist.all_reduce(mean)
    hgc.ddp.keep_until_exit(mean)
    mean = (mean / dist.get_world_size()).tolist()
    return {"codec": args.codec, "options": args.options, "world_size": dist.get_world_size(), **extra,
            "optimizer": args.optimizer, "steps": args.steps, "cosine_steps": args.cosine_steps,
            "first_loss": sum(mean[:10]) / 10,
            "last_loss": sum(mean[-20:]) / 20, "test_loss": test, "seconds": elapsed,
            "finite": all(map(math.isfinite, mean)), "parameters": sum(p.numel() for p in model.parameters())}


def main(argv=None):
    args = parse_args(argv)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    x_tr, y_tr, x_te, y_te, vocab = load_text(args.context)
    model = build(args, vocab)
    opt = make_optimizer(args, model.parameters())
    state = None
    if args.codec != "none":
        state = hgc.fsdp.register(model, args.codec, optimizer=opt, **args.options)
    else:
        hgc.ddp.hold_backward_context(model)   # gloo's abort at exit (horovod_gradcomp/ddp/gloo_exit.py)
    start = torch.zeros(1, dtype=torch.int64)   # the steps already trained (the same on every rank)
    everything = {"training": Training(model, opt), "start": start}
    if state is not None:   # both modes' states are DCP Stateful objects
        everything["compression"] = state
    if args.resume:
        dcp.load(everything, checkpoint_id=args.resume)
    losses, elapsed = train(model, opt, args, x_tr, y_tr, rank, int(start))
    if args.ckpt_dir:
        start += args.steps
        dcp.save(everything, checkpoint_id=args.ckpt_dir)
    result = summarize(args, model, losses, elapsed, x_te, y_te, hsdp=args.hsdp)
    result["stats"] = None if state is None else state.stats()
    if rank == 0:
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{args.codec}: loss {result['first_loss']:.3f} -> {result['last_loss']:.3f}, "
                  f"test {result['test_loss']:.3f}, {elapsed:.1f}s", flush=True)
            if state is not None:
                s = result["stats"]
                print(f"bytes sent per step {s['bytes_sent_per_step']:.0f} (FSDP2 dense: "
                      f"{s['bytes_dense_per_step']:.0f}), state {s['memory_bytes']} bytes", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
