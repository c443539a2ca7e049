"""Cut a tensor into K stripes, one per owner rank, for the two-phase exchange.

A tensor of shape ``shape`` is seen as the matrix ``M = t.reshape(rows, cols)`` of
:func:`matrix_shape`: ``rows = shape[0]`` and ``cols = prod(shape[1:])`` for >= 2-D
tensors (the 2-D view on which onebit ties its reconstruction values per column);
``rows = numel`` and ``cols = 1`` for 1-D and 0-d tensors (one column).

Ranges (:func:`balanced_ranges`): ``n`` items split among K owners are contiguous and in
owner order; owner ``s`` gets ``n // K + (1 if s < n % K else 0)`` items, so sizes differ by
at most one, the larger ones go to the first owners, and owners past ``n`` get the empty
range ``(n, n)``.

A stripe is one owner's part of ``M`` along one axis:

* ``axis="rows"`` (:func:`row_stripes`): ``M[start:stop, :]``, which is the contiguous
  flat slice ``[start*cols, stop*cols)`` of the row-major tensor: taking it is a view.
* ``axis="columns"`` (:func:`column_stripes`): ``M[:, start:stop]``, strided: taking it
  copies. Used where splitting the rows would duplicate per-column data in every stripe
  (onebit's two reconstruction values per column; see ``two_phase.choose_axis``).

The tensor that a stripe is encoded as (``Stripe.shape``) keeps the columns: ``[stop-start,
cols]`` (rows axis) or ``[rows, stop-start]`` (columns axis) for >= 2-D tensors, so that a
per-column codec keeps one column per column; for 1-D and 0-d tensors it is flat: ``[stop-start]``
(rows axis; the columns axis, with its single column, gives owner 0 all ``[numel]`` values and
the others ``[0]``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import List, Sequence, Tuple

import torch

AXES = ("rows", "columns")


def matrix_shape(shape: Sequence[int]) -> Tuple[int, int]:
    """(rows, cols) of the 2-D view: ``(shape[0], prod(shape[1:]))`` for >= 2-D shapes,
    ``(numel, 1)`` for 1-D and 0-d shapes."""
    shape = tuple(int(d) for d in shape)
    if len(shape) <= 1:
        return math.prod(shape), 1
    return shape[0], math.prod(shape[1:])


def balanced_ranges(n: int, k: int) -> List[Tuple[int, int]]:
    """``k`` contiguous ``(start, stop)`` ranges covering ``0..n`` in order; range ``s`` holds
    ``n // k + (s < n % k)`` items (empty ranges ``(n, n)`` when ``k > n``)."""
    if k < 1:
        raise ValueError(f"stripes: need at least one owner, got k={k}")
    if n < 0:
        raise ValueError(f"stripes: negative size {n}")
    base, extra = divmod(n, k)
    out, start = [], 0
    for s in range(k):
        stop = start + base + (1 if s < extra else 0)
        out.append((start, stop))
        start = stop
    return out


def row_stripes(shape: Sequence[int], k: int) -> List[Tuple[int, int]]:
    """The K row ranges ``(start, stop)`` of the 2-D view of ``shape`` (see the module doc)."""
    return balanced_ranges(matrix_shape(shape)[0], k)


def column_stripes(shape: Sequence[int], k: int) -> List[Tuple[int, int]]:
    """The K column ranges ``(start, stop)`` of the 2-D view of ``shape``."""
    return balanced_ranges(matrix_shape(shape)[1], k)


@dataclass(frozen=True)
class Stripe:
    """Owner ``owner``'s part ``[start, stop)`` along ``axis`` of a tensor of ``full_shape``.

    The derived geometry (``matrix``, ``shape``, ``numel``) is computed once per stripe: a
    plan's stripes are reused every step, and the two-phase exchange reads them several
    times per stripe and step."""

    full_shape: Tuple[int, ...]
    axis: str
    owner: int
    start: int
    stop: int

    @cached_property
    def matrix(self) -> Tuple[int, int]:
        return matrix_shape(self.full_shape)

    @cached_property
    def shape(self) -> Tuple[int, ...]:
        """The shape the stripe is encoded as (see the module doc)."""
        rows, cols = self.matrix
        width = self.stop - self.start
        part = (width, cols) if self.axis == "rows" else (rows, width)
        return (part[0] * part[1],) if len(self.full_shape) <= 1 else part

    @cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def is_view(self) -> bool:
        """True when :meth:`take` of a contiguous tensor returns a view (rows axis)."""
        return self.axis == "rows"

    def window(self, tensor: torch.Tensor) -> torch.Tensor:
        """The stripe of ``tensor`` (of ``full_shape``) as a 2-D slice of its matrix view, without
        a copy when ``tensor`` is contiguous (a strided view for the columns axis); its row-major
        order is :meth:`take`'s."""
        m = tensor.reshape(self.matrix)
        return m[self.start:self.stop] if self.axis == "rows" else m[:, self.start:self.stop]

    def take(self, tensor: torch.Tensor) -> torch.Tensor:
        """The stripe of ``tensor`` (of ``full_shape``), contiguous, of shape :attr:`shape`:
        a view of ``tensor`` when it is contiguous and :attr:`is_view`, else a copy."""
        return self.window(tensor).contiguous().view(self.shape)

    def put(self, tensor: torch.Tensor, value: torch.Tensor) -> None:
        """Write ``value`` (of :attr:`shape`) into the stripe of ``tensor`` (contiguous, of
        ``full_shape``), in place."""
        m = tensor.view(self.matrix)
        part = m[self.start:self.stop] if self.axis == "rows" else m[:, self.start:self.stop]
        part.copy_(value.view(part.shape))


def stripes(shape: Sequence[int], k: int, axis: str = "rows") -> List[Stripe]:
    """The K :class:`Stripe` of a tensor of ``shape`` along ``axis`` (owner s = stripe s)."""
    if axis not in AXES:
        raise ValueError(f"stripes: axis must be one of {AXES}, got {axis!r}")
    full = tuple(int(d) for d in shape)
    ranges = row_stripes(full, k) if axis == "rows" else column_stripes(full, k)
    return [Stripe(full, axis, s, a, b) for s, (a, b) in enumerate(ranges)]


def stripe_key(name: str, owner: int) -> str:
    """The name of stripe ``owner`` of tensor ``name`` in fused layouts and owner residuals."""
    return f"{name}[{owner}]"
