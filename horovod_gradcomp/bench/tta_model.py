"""The language model ``bench tta`` trains: a small decoder-only transformer over characters.

Token and learned position embeddings, ``layers`` pre-norm transformer blocks with causal
self-attention (``torch.nn.TransformerEncoderLayer`` under a causal mask: the decoder-only
form, no cross-attention), a final LayerNorm and a linear head to the vocabulary. Sizes:
:data:`SIZES` (``small``: about 1.2 M parameters with the pydoc text's vocabulary; ``tiny``:
a few tens of thousands, for ``--quick``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import torch
import torch.nn as nn


@dataclass(frozen=True)
class Size:
    """Width ``dim``, ``layers`` blocks of ``heads`` heads, feed-forward ``4 dim``, ``context`` characters."""

    dim: int
    layers: int
    heads: int
    context: int


SIZES: Dict[str, Size] = {"small": Size(dim=128, layers=6, heads=4, context=32),
                          "tiny": Size(dim=32, layers=1, heads=2, context=16)}


class CharTransformer(nn.Module):
    """Decoder-only transformer: ``forward(x)`` maps [batch, T] character ids (T <= context) to
    [batch, T, vocab] logits, position t attending to positions <= t only."""

    def __init__(self, vocab: int, size: Size):
        super().__init__()
        self.size = size
        self.embed = nn.Embedding(vocab, size.dim)
        self.position = nn.Embedding(size.context, size.dim)
        block = nn.TransformerEncoderLayer(size.dim, size.heads, dim_feedforward=4 * size.dim, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, size.layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(size.dim)
        self.head = nn.Linear(size.dim, vocab)
        mask = torch.triu(torch.full((size.context, size.context), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.size.context:
            raise ValueError(f"sequence of {t} characters exceeds the model's context of {self.size.context}")
        h = self.embed(x) + self.position(torch.arange(t, device=x.device))
        h = self.blocks(h, mask=self.causal[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def lm_loss(model: nn.Module, seq: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per character) of predicting ``seq[:, 1:]`` from ``seq[:, :-1]``."""
    logits = model(seq[:, :-1])
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), seq[:, 1:].reshape(-1))


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
