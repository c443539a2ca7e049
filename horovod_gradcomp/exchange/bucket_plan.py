"""Buckets: groups of gradients exchanged together, in an order every rank shares.

A plan is built from the names exchanged in the previous step, in *reverse registration
order* (``named_parameters`` reversed: roughly the order in which backward produces the
gradients), cut whenever a bucket reaches ``bucket_bytes`` of gradient data. A tensor
larger than ``bucket_bytes`` is a bucket of its own. Every rank exchanged the same names
in that step (checked), so every rank builds the same plan.
"""
from __future__ import annotations

from typing import List, Mapping, Sequence


class BucketPlan:
    """Fields:
        buckets: lists of names; bucket j is exchanged j-th on every rank.
        names: frozenset of every name in the plan.
    """

    def __init__(self, names_in_order: Sequence[str], nbytes: Mapping[str, int], bucket_bytes: int):
        if isinstance(bucket_bytes, bool) or not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise ValueError(f"bucket_bytes must be a positive int, got {bucket_bytes!r}")
        self.buckets: List[List[str]] = []
        current: List[str] = []
        size = 0
        for n in names_in_order:
            current.append(n)
            size += nbytes[n]
            if size >= bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.names = frozenset(n for b in self.buckets for n in b)

    def __len__(self) -> int:
        return len(self.buckets)

    def __repr__(self) -> str:
        return f"BucketPlan({len(self.buckets)} buckets, sizes {[len(b) for b in self.buckets]})"
