"""Data-parallel training with Horovod + gradient compression: scikit-learn's bundled digits
(an MLP) or next-character prediction on a text Python ships (a small recurrent model).

Run (2 ranks, 1-bit SGD with error feedback):

    mpirun --allow-run-as-root --oversubscribe -np 2 .venv/bin/python examples/train.py --codec onebit --json

``--codec`` takes ``none`` (Horovod's fp32 allreduce), ``fp16``, ``onebit-noef`` (onebit
without error feedback) or any name in ``hgc.available_codecs()``; ``--codec-opt KEY=VALUE``
passes options to that codec. ``--task digits`` (default): 1797 8x8 images, 10 classes,
shipped with scikit-learn; ``--task charlm``: windows of ``--context`` characters of
``pydoc_data.topics`` (embedding 32, one GRU or LSTM layer, a linear layer to the 103-character
vocabulary; every position predicts the next character). Nothing is downloaded. Each rank
trains on its shard (``rank::size``) of a fixed split; at the end rank 0 evaluates the test
set and every rank's parameters are checked to be bitwise identical.

Every step runs ``optimizer.synchronize()``, then the skip rule (as ``torch.amp.GradScaler``:
if any averaged gradient is non-finite, the step is skipped on every rank and counted), then
``--clip-norm`` (dense and quantizing codecs: ``clip_grad_norm_`` of the averaged gradient;
dgc: the codec's own local clipping, ``clip_norm * sqrt(K)`` per rank under Horovod's
``op=hvd.Average``, before its momentum),
then ``optimizer.step()`` under ``skip_synchronize()`` (``--optimizer``: SGD with momentum, Adam
or AdamW; ``--optimizer-warmup N``: the learning rate warmed up linearly over N steps by a
LambdaLR schedule, the same for every codec). ``--optimizer onebit-adam`` / ``onebit-adamw``
(with ``--codec none``): ``hgc.OnebitAdam(W)``, not wrapped in ``hvd.DistributedOptimizer``:
its ``step()`` exchanges the gradients (warm-up) or Adam's momentum (1-bit) itself. ``--nan-at S --nan-rank R`` makes
rank R's loss NaN at global step S. With ``--json`` rank 0 prints one JSON object as its last
line of output; the exit status is 3 if parameters differ across ranks, 4 if the ranks did not
skip the same steps.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import horovod.torch as hvd
from tqdm import tqdm

import horovod_gradcomp as hgc
from common import add_codec_args, check_codec, codec_options, load_data, load_text, params_digest, shard

DENSE = {"none": hgc.Compression.none, "fp16": hgc.Compression.fp16}
# Per task: epochs, learning rate.
TASK_DEFAULTS = {"digits": (30, 0.05), "charlm": (4, 0.5)}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--task", choices=tuple(TASK_DEFAULTS), default="digits")
    add_codec_args(p, "none | fp16 | onebit-noef | any of hgc.available_codecs(): "
                   + ", ".join(hgc.available_codecs()))
    p.add_argument("--label", default=None, help="name of this run in the output (default: --codec)")
    p.add_argument("--epochs", type=int, default=None, help="default: digits 30, charlm 4")
    p.add_argument("--batch-size", type=int, default=32, help="per rank")
    p.add_argument("--lr", type=float, default=None, help="default: digits 0.05, charlm 0.5")
    p.add_argument("--momentum", type=float, default=0.9, help="sgd's momentum (dgc: the codec's)")
    p.add_argument("--optimizer", choices=("sgd", "adam", "adamw", "onebit-adam", "onebit-adamw"), default="sgd",
                   help="torch.optim's SGD (with --momentum), Adam or AdamW (betas 0.9, 0.999); onebit-adam(w): "
                        "hgc.OnebitAdam(W), which exchanges Adam's momentum itself (--codec none only)")
    p.add_argument("--onebit-adam-warmup", type=int, default=100, metavar="W",
                   help="onebit-adam(w): the dense warm-up steps before the variance is frozen")
    p.add_argument("--weight-decay", type=float, default=0.0, help="the optimizer's weight_decay")
    p.add_argument("--optimizer-warmup", type=int, default=0, metavar="N",
                   help="the script's learning-rate warm-up: lr * (t + 1) / N at step t < N (a LambdaLR "
                        "schedule; the gradients are not touched), for every codec")
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--clip-norm", type=float, default=None,
                   help="clip the gradient norm (dgc: its local clipping, clip_norm * sqrt(K) per rank)")
    p.add_argument("--context", type=int, default=32, help="charlm: characters per window")
    p.add_argument("--stride", type=int, default=16, help="charlm: a training window every STRIDE characters")
    p.add_argument("--rnn", choices=("gru", "lstm"), default="gru", help="charlm: the recurrent layer")
    p.add_argument("--nan-at", type=int, default=None, metavar="STEP",
                   help="global step (from 0) at which --nan-rank's loss is multiplied by NaN")
    p.add_argument("--nan-rank", type=int, default=0, help="the rank whose loss --nan-at poisons")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank (0: torch's default)")
    p.add_argument("--json", action="store_true", help="rank 0 prints a JSON summary as its last line")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it is off anyway when not a tty)")
    args = p.parse_args(argv)
    epochs, lr = TASK_DEFAULTS[args.task]
    args.epochs = epochs if args.epochs is None else args.epochs
    args.lr = lr if args.lr is None else args.lr
    return args


def make_optimizer(name, params, lr, momentum, weight_decay):
    """torch.optim's SGD (with ``momentum``), Adam or AdamW at ``lr``."""
    if name not in ("sgd", "adam", "adamw"):
        raise SystemExit(f"--optimizer {name} is not a torch.optim optimizer here "
                         "(onebit-adam(w): examples/train.py only)")
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    return (torch.optim.Adam if name == "adam" else torch.optim.AdamW)(params, lr=lr, weight_decay=weight_decay)


def make_compression(name, model, options, momentum, dgc_defaults=None):
    """none/fp16: Horovod's dense allreduce; onebit-noef: onebit without error feedback;
    anything else: the codec's own factory (hgc.Compression.<name>, with that codec's
    defaults) where there is one, else the registered codec of that name. dgc gets the
    momentum (None for Adam/AdamW: DGC then adopts none, with its warning) and ``dgc_defaults``
    (the warm-up; train.py: the paper's 4 epochs for digits,
    its one epoch, counted in steps, for the language model) unless --codec-opt says otherwise."""
    if name in DENSE:
        if options:
            raise SystemExit(f"--codec {name} takes no --codec-opt")
        return DENSE[name]()
    if name == "onebit-noef":
        return hgc.Compression.onebit(model.named_parameters(), error_feedback=False, **options)
    if name == "dgc":  # DGC keeps the momentum itself (the optimizer below then has none)
        defaults = dgc_defaults or {"warmup_length": 4, "warmup_unit": "epoch"}
        # momentum None (Adam, AdamW): DGC runs without its SGD momentum correction (it warns once)
        options = {**({"momentum": momentum} if momentum is not None else {}), **defaults, **options}
    factory = getattr(hgc.Compression, name, None)
    if factory is not None:
        return factory(model.named_parameters(), **options)
    return hgc.Compression.codec(name, model.named_parameters(), **options)


class CharRNN(nn.Module):
    """Embedding -> one GRU/LSTM layer -> linear to the vocabulary, at every position."""

    def __init__(self, vocab, embed=32, hidden=128, rnn="gru"):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = (nn.GRU if rnn == "gru" else nn.LSTM)(embed, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, x):
        h, _ = self.rnn(self.embed(x))
        return self.out(h)  # (batch, time, vocab)


def perplexity(loss):
    """exp(loss): inf when the loss is beyond a float's exponent (a diverged run), not an error."""
    try:
        return math.exp(loss)
    except OverflowError:
        return math.inf


def next_chars(x, y):
    """The target of every position of the windows x: x shifted by one, then y."""
    return torch.cat([x[:, 1:], y[:, None]], dim=1)


def lm_loss(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), next_chars(x, y).reshape(-1))


def all_finite(params):
    return all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)


def main(argv=None):
    args = parse_args(argv)
    check_codec(args.codec, [*DENSE, "onebit-noef", *hgc.available_codecs()])
    own_exchange = args.optimizer.startswith("onebit-")
    if own_exchange and args.codec != "none":
        raise SystemExit(f"--optimizer {args.optimizer} exchanges the momentum itself: use --codec none")
    label = args.label or (args.optimizer if own_exchange else args.codec)
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    if args.task == "charlm":
        x_tr, y_tr, x_te, y_te, vocab = load_text(args.context, train_stride=args.stride)
    else:
        x_tr, y_tr, x_te, y_te = load_data(args.seed)
    x_shard, y_shard, steps = shard(x_tr, y_tr, rank, size, args.batch_size)

    if args.task == "charlm":
        model = CharRNN(vocab, hidden=args.hidden, rnn=args.rnn)
        loss_fn = lm_loss
        dgc_defaults = {"warmup_length": steps, "warmup_unit": "step"}  # Lin et al.: 1 warm-up epoch for LMs
    else:
        model = nn.Sequential(nn.Linear(x_tr.shape[1], args.hidden), nn.ReLU(), nn.Linear(args.hidden, 10))
        loss_fn = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
        dgc_defaults = None
    options = codec_options(args.codec_opt)
    clip_in_codec = args.codec == "dgc"
    if clip_in_codec and args.clip_norm is not None:
        options.setdefault("clip_norm", args.clip_norm)
    if own_exchange:   # hgc.OnebitAdam(W): no hvd.DistributedOptimizer, its own exchange and stats
        optimizer = (hgc.OnebitAdamW if args.optimizer == "onebit-adamw" else hgc.OnebitAdam)(
            model.named_parameters(), lr=args.lr, weight_decay=args.weight_decay,
            warmup_steps=args.onebit_adam_warmup)
        compression, own_momentum = optimizer.compression, False
    else:
        compression = make_compression(args.codec, model, options,
                                       args.momentum if args.optimizer == "sgd" else None, dgc_defaults)
        # A compressor that owns the momentum (DGC) needs plain SGD underneath.
        own_momentum = isinstance(getattr(compression, "memory", None), hgc.DGCMemory)
        optimizer = make_optimizer(args.optimizer, model.parameters(), args.lr,
                                   0.0 if own_momentum else args.momentum, args.weight_decay)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
    warmup = args.optimizer_warmup
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda t: min(1.0, (t + 1) / warmup)) if warmup else None
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    if not own_exchange:   # OnebitAdam starts with an empty state on every rank (its step is a collective)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    params = list(model.parameters())

    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    bar = tqdm(total=args.epochs * steps, desc=label, file=sys.stderr, leave=False,
               disable=rank != 0 or args.no_progress or not sys.stderr.isatty())
    skipped = []  # global steps this rank skipped (non-finite averaged gradient)
    t0 = time.perf_counter()
    model.train()
    for epoch in range(args.epochs):
        if hasattr(compression, "set_epoch"):
            compression.set_epoch(epoch)  # DGC's density warm-up counts epochs
        order = torch.randperm(len(x_shard), generator=gen)
        loss_sum, loss_n = 0.0, 0
        for i in range(steps):
            step = epoch * steps + i
            idx = order[i * args.batch_size:(i + 1) * args.batch_size]
            optimizer.zero_grad()
            loss = loss_fn(model, x_shard[idx], y_shard[idx])
            value = loss.item()
            if step == args.nan_at and rank == args.nan_rank:
                loss = loss * float("nan")
            loss.backward()
            if own_exchange:   # exchange and update in one collective step; a non-finite mean skips it
                before = optimizer.skipped_steps
                optimizer.step()
                took = optimizer.skipped_steps == before
            else:
                optimizer.synchronize()
                took = all_finite(params)   # every rank sees the same averaged gradients: all skip alike
                if took:
                    if args.clip_norm is not None and not clip_in_codec:
                        torch.nn.utils.clip_grad_norm_(params, args.clip_norm)
                    with optimizer.skip_synchronize():
                        optimizer.step()
            if took:
                loss_sum, loss_n = loss_sum + value, loss_n + 1
            else:
                skipped.append(step)
            if schedule is not None:
                schedule.step()
            bar.update()
        train_loss = hvd.allreduce(torch.tensor(loss_sum / max(loss_n, 1)), name=f"loss.{epoch}").item()
        bar.set_postfix(epoch=epoch + 1, loss=f"{train_loss:.4f}")
    seconds = time.perf_counter() - t0
    bar.close()

    digests = hvd.allgather_object(params_digest(model))
    identical = len(set(digests)) == 1
    skipped_all = hvd.allgather_object(skipped)
    same_skips = all(s == skipped_all[0] for s in skipped_all)
    stats = compression.stats()
    if rank == 0:
        model.eval()
        with torch.no_grad():
            logits = model(x_te)
            if args.task == "charlm":
                target = next_chars(x_te, y_te)
                acc = (logits.argmax(-1) == target).float().mean().item()
                test_loss = F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1)).item()
            else:
                acc = (logits.argmax(1) == y_te).float().mean().item()
                test_loss = F.cross_entropy(logits, y_te).item()
        sent, dense = stats["bytes_sent_per_step"], stats["bytes_dense_per_step"]
        lm = f", test loss {test_loss:.4f} nats/char (perplexity {perplexity(test_loss):.2f})" \
            if args.task == "charlm" else ""
        print(f"[{label}] {args.task}, {size} ranks, {args.epochs} epochs x {steps} steps: test accuracy {acc:.4f}{lm}, "
              f"train loss {train_loss:.4f}, {sent:,.0f} B/step sent vs {dense:,.0f} B/step dense "
              f"({stats['wire_ratio'] or float('nan'):.1f}x), {seconds:.1f} s, params identical across ranks: {identical}"
              + (f", skipped steps per rank {[len(s) for s in skipped_all]} at {skipped_all[0]}" if any(skipped_all)
                 else ""), flush=True)
        if args.json:
            print(json.dumps({
                "codec": label, "task": args.task, "ranks": size, "epochs": args.epochs, "test_accuracy": acc,
                "test_loss": test_loss, "perplexity": perplexity(test_loss),
                "train_loss": train_loss, "bytes_sent_per_step": sent, "bytes_dense_per_step": dense,
                "wire_ratio": stats["wire_ratio"], "payload_ratio": stats["payload_ratio"],
                "seconds": seconds, "params_identical": identical, "params_digest": digests[0],
                "transport": type(getattr(compression, "communicator", None)).__name__,
                "steps": stats["steps"], "steps_per_epoch": steps, "batch_size": args.batch_size, "lr": args.lr,
                "momentum": args.momentum, "optimizer": args.optimizer, "weight_decay": args.weight_decay,
                "optimizer_warmup": args.optimizer_warmup,
                "onebit_adam_warmup": args.onebit_adam_warmup if own_exchange else None, "clip_norm": args.clip_norm, "seed": args.seed,
                "codec_options": {k: v for k, v in options.items() if isinstance(v, (int, float, str, bool))},
                "dgc_schedule": repr(compression.memory.schedule) if own_momentum else None,
                "adam_defaults_taken": dict(getattr(compression, "adapted_options", {})),   # the codec's, under Adam
                "nan_at": args.nan_at, "nan_rank": args.nan_rank if args.nan_at is not None else None,
                "skipped_steps_per_rank": [len(s) for s in skipped_all], "skipped_at": skipped_all[0],
                "same_skips_on_all_ranks": same_skips, "nonfinite_steps": stats.get("nonfinite_steps"),
                **({"context": args.context, "stride": args.stride, "rnn": args.rnn, "hidden": args.hidden,
                    "train_windows": len(x_tr), "test_predictions": y_te.numel() * args.context}
                   if args.task == "charlm" else {}),
            }), flush=True)
    hvd.shutdown()
    if not identical:
        return 3
    return 0 if same_skips else 4


if __name__ == "__main__":
    sys.exit(main())
