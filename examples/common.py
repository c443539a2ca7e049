"""What the examples share: the two data sets, the sharding of the training set, the digits
model and its plain training epoch, the ``--codec``/``--codec-opt`` options, the parameter digest.

The examples are run as ``python examples/X.py``, which puts ``examples/`` on ``sys.path``;
they import this module as ``from common import ...``.
"""
from __future__ import annotations

import ast
import hashlib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def load_data(seed):
    """Stratified 80/20 split of digits, standardized with the training statistics."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    x, y = load_digits(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x.astype(np.float32), y, test_size=0.2, stratify=y, random_state=seed)
    mean, std = x_tr.mean(0), x_tr.std(0)
    std[std == 0] = 1.0
    as_t = lambda a, dt: torch.from_numpy(np.ascontiguousarray(a)).to(dt)  # noqa: E731
    return (as_t((x_tr - mean) / std, torch.float32), as_t(y_tr, torch.long),
            as_t((x_te - mean) / std, torch.float32), as_t(y_te, torch.long))


def shard(x_tr, y_tr, rank, size, batch_size):
    """This rank's share of the training set (every ``size``-th sample from ``rank``) and the
    number of steps per epoch, the same on every rank (shards differ by at most one sample)."""
    steps = len(x_tr) // (size * batch_size)
    if steps == 0:
        raise SystemExit(f"--batch-size {batch_size} x {size} ranks exceeds the {len(x_tr)} training samples")
    return x_tr[rank::size], y_tr[rank::size], steps


def digits_setup(seed, hidden, rank, size, batch_size):
    """examples/train.py's digits run on one rank: torch's generator seeded with ``seed``, the
    data (:func:`load_data`), this rank's shard (:func:`shard`) and the MLP (64 -> ``hidden`` ->
    ReLU -> 10). Returns (model, x_shard, y_shard, steps per epoch, x_te, y_te)."""
    torch.manual_seed(seed)
    x_tr, y_tr, x_te, y_te = load_data(seed)
    x_shard, y_shard, steps = shard(x_tr, y_tr, rank, size, batch_size)
    model = nn.Sequential(nn.Linear(x_tr.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, 10))
    return model, x_shard, y_shard, steps, x_te, y_te


def train_epoch(model, optimizer, x_shard, y_shard, steps, batch_size, gen):
    """One epoch of plain steps (zero_grad, cross-entropy, backward, ``optimizer.step()``) over
    the shard in an order drawn from ``gen``; returns the sum of the ``steps`` losses."""
    order = torch.randperm(len(x_shard), generator=gen)
    loss_sum = 0.0
    for i in range(steps):
        idx = order[i * batch_size:(i + 1) * batch_size]
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x_shard[idx]), y_shard[idx])
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()
    return loss_sum


def add_codec_args(p, codec_help, default="onebit"):
    """``--codec NAME`` and the repeatable ``--codec-opt KEY=VALUE`` on the parser ``p``."""
    p.add_argument("--codec", default=default, help=codec_help)
    p.add_argument("--codec-opt", action="append", default=[], metavar="KEY=VALUE",
                   help="codec option (repeatable); VALUE is a Python literal or a string")


def parse_codec_args(p, argv, known):
    """``p.parse_args(argv)`` with ``args.options``, the ``--codec-opt`` dict; a bad pair or a
    ``--codec`` not in ``known`` is refused through ``p.error`` (usage, exit status 2)."""
    args = p.parse_args(argv)
    args.options = codec_options(args.codec_opt, p.error)
    check_codec(args.codec, known, p.error)
    return args


def _fail(message, error):
    if error is None:
        raise SystemExit(message)
    error(message)  # argparse's p.error: usage and the message on stderr, exit status 2
    raise SystemExit(message)  # an ``error`` that returned


def codec_options(pairs, error=None):
    """The ``--codec-opt KEY=VALUE`` pairs as a dict (VALUE a Python literal where it parses as
    one, ``true``/``false`` in any case as a bool, else the string). A pair without ``=`` is
    refused with a message naming it: through ``error(message)`` when given (a parser's
    ``p.error``), else ``SystemExit(message)``."""
    opts = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            _fail(f"--codec-opt expects KEY=VALUE, got {pair!r}", error)
        if value.lower() in ("true", "false"):
            opts[key] = value.lower() == "true"
            continue
        try:
            opts[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            opts[key] = value
    return opts


def check_codec(name, known, error=None):
    """Refuses a ``--codec`` not in ``known`` as :func:`codec_options` refuses a bad pair."""
    if name not in known:
        _fail(f"unknown --codec {name!r}; choose one of {', '.join(known)}", error)


def load_text(context, train_stride=16, test_stride=64):
    """Next-character windows of the stdlib's pydoc topics (about 0.75 MB of English docs):
    the first 90% for training (a window every ``train_stride`` characters), the rest for
    testing (every ``test_stride``). ``x`` holds ``context`` characters, ``y`` the one after
    them. Returns (x_tr, y_tr, x_te, y_te, vocabulary size)."""
    import pydoc_data.topics as topics
    with open(topics.__file__, encoding="utf-8") as f:
        text = f.read()
    vocab = sorted(set(text))
    code = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([code[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))

    def windows(lo, hi, stride):
        pos = torch.arange(lo, hi - context - 1, stride)
        return data[pos[:, None] + torch.arange(context)], data[pos + context]
    return (*windows(0, split, train_stride), *windows(split, len(data), test_stride), len(vocab))


def params_digest(model):
    """SHA-256 of the model's state dict (names and bytes, in name order)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def all_gather_digests(digest: str) -> list:
    """Every rank's :func:`params_digest` over torch.distributed (the default group), in rank
    order. The buffers stay referenced until the process exits
    (``hgc.ddp.keep_until_exit``: PyTorch 2.13 can abort a gloo job at exit without it)."""
    import torch.distributed as dist
    from horovod_gradcomp.ddp import keep_until_exit

    mine = torch.tensor(list(bytes.fromhex(digest)), dtype=torch.uint8)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    keep_until_exit(mine, *every)
    return [bytes(t.tolist()).hex() for t in every]
