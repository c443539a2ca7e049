"""What the examples share: the two data sets, the sharding of the training set, the parameter digest.

The examples are run as ``python examples/X.py``, which puts ``examples/`` on ``sys.path``;
they import this module as ``from common import ...``.
"""
from __future__ import annotations

import hashlib

import numpy as np
import torch


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
