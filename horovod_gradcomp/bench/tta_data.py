"""The text ``bench tta`` trains on: the examples' character data (``examples/common.py``'s
``load_text``: Python's own pydoc topics, about 0.75 MB of English documentation that every
Python installation ships), as sequences of ``context + 1`` characters for a language model.

``load_text`` gives windows of ``context`` characters and the character after each; a window
joined to its next character is one training sequence (the model predicts every character
from the ones before it). The first 90% of the text trains, the rest is held out.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

#: Where the examples' data loader lives (the repository's examples/ directory).
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load_text_windows(context: int, train_stride: int):
    """``examples/common.py``'s ``load_text(context, train_stride)``; RuntimeError when the
    repository's examples/ directory is not there (an installed wheel without the repository)."""
    if not (EXAMPLES / "common.py").is_file():
        raise RuntimeError(f"bench tta reads its text through {EXAMPLES / 'common.py'} (the examples' loader): "
                           "run it from a checkout of the repository")
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    from common import load_text
    return load_text(context, train_stride=train_stride)


@dataclass
class TextData:
    """``train``: [n, context + 1] sequences of this rank's shard; ``held_out``: [m, context + 1]
    sequences of the held-out text (the same on every rank); ``vocab``: characters."""

    train: torch.Tensor
    held_out: torch.Tensor
    vocab: int


def load(context: int, rank: int, size: int, held_out: int = 256, train_stride: int = 16) -> TextData:
    """This rank's sequences (every ``size``-th from ``rank``) and the first ``held_out``
    held-out sequences."""
    x_tr, y_tr, x_te, y_te, vocab = load_text_windows(context, train_stride)
    train = torch.cat([x_tr, y_tr[:, None]], dim=1)[rank::size]
    test = torch.cat([x_te, y_te[:, None]], dim=1)[:held_out]
    return TextData(train, test, vocab)


def batches(data: TextData, batch: int, seed: int):
    """An endless stream of [batch, context + 1] training sequences of this rank's shard, in a
    fresh random order each pass (seeded: the same stream for every row of a run)."""
    gen = torch.Generator().manual_seed(seed)
    n = len(data.train)
    if n < batch:
        raise ValueError(f"--batch {batch} exceeds this rank's {n} training sequences")
    while True:
        order = torch.randperm(n, generator=gen)
        for i in range(0, n - batch + 1, batch):
            yield data.train[order[i:i + batch]]
