"""A numpy model of the 1-bit codec's column statistics (issue 32 item 4): the summation order and
the column finish, written from the order documented in docs (ALGORITHMS.md section 1 and the
order stated in csrc/device/onebit_functors.h's header comment), not from the kernels' code.

The order: v = g (+ r) in the arithmetic type A (float32; float64 for fp64 tensors).
* A matrix of ``cols`` >= 2 columns: rows in blocks of ROW_BLOCK; column j of a block is summed in
  row order in A from 0 (non-negative values into p, negative ones and NaN into m, a count of the
  non-negative ones into c); the block sums are added in float64 in block order from 0.0.
* A one-column tensor of n values: the [ceil(n / LANES), LANES] row-major view of its values (the
  last row partial) summed per lane as a column above, then the LANES lane totals in lane order.
* Rows mode: each row of the [rows, cols] matrix as a one-column tensor of its cols values.
The finish of a column of ``count`` values: a+ = float32(p / c) (0 when c == 0), a- =
float32(m / (count - c)) (0 when no value is negative); -0.0 counts as non-negative, NaN as negative.
"""
from __future__ import annotations

import numpy as np

ROW_BLOCK = 128
LANES = 16


def acc_type(dtype_name: str):
    """The arithmetic type of a tensor dtype: float64 for fp64, else float32."""
    return np.float64 if dtype_name == "float64" else np.float32


def finish(p: np.ndarray, m: np.ndarray, c: np.ndarray, count) -> tuple:
    """(a+, a-) as float32 from float64 totals p, m, c of columns of ``count`` values each."""
    neg = np.asarray(count, dtype=np.float64) - c
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        a_pos = np.where(c > 0, (p / np.where(c > 0, c, 1.0)).astype(np.float32), np.float32(0))
        a_neg = np.where(neg > 0, (m / np.where(neg > 0, neg, 1.0)).astype(np.float32), np.float32(0))
    return a_pos.astype(np.float32), a_neg.astype(np.float32)


def column_totals(V: np.ndarray, valid: np.ndarray | None = None, row_block: int = ROW_BLOCK) -> tuple:
    """float64 totals (p, m, c) of each column of V ([rows, ...], in its arithmetic type: the
    columns are V[:, ...]), rows in blocks of ``row_block`` summed in that type, the blocks added
    in float64 in block order. ``valid`` (V's shape, bool) leaves out the entries where it is False."""
    rows = V.shape[0]
    acc = V.dtype.type
    P, M, C = (np.zeros(V.shape[1:], np.float64) for _ in range(3))
    with np.errstate(over="ignore", invalid="ignore"):
        for b0 in range(0, rows, row_block):
            bp, bm, bc = (np.zeros(V.shape[1:], acc) for _ in range(3))
            for row in range(b0, min(rows, b0 + row_block)):
                x = V[row]
                nonneg = x >= 0  # False for NaN
                ok = True if valid is None else valid[row]
                bp = np.where(ok, bp + np.where(nonneg, x, acc(0)), bp)
                bm = np.where(ok, bm + np.where(nonneg, acc(0), x), bm)
                bc = np.where(ok, bc + nonneg.astype(acc), bc)
            P, M, C = P + bp.astype(np.float64), M + bm.astype(np.float64), C + bc.astype(np.float64)
    return P, M, C


def one_column_totals(v: np.ndarray, row_block: int = ROW_BLOCK, lanes: int = LANES) -> tuple:
    """float64 totals (p, m, c), each [G], of the G one-column tensors v ([G, n], arithmetic type):
    each one's [ceil(n / lanes), lanes] view summed per lane as a column, the lanes added in lane
    order."""
    G, n = v.shape
    rows = -(-n // lanes)
    padded = np.zeros((G, rows * lanes), v.dtype)
    padded[:, :n] = v
    valid = np.zeros((G, rows * lanes), bool)
    valid[:, :n] = True
    view = lambda a: a.reshape(G, rows, lanes).transpose(1, 0, 2)  # [rows, G, lanes]
    P, M, C = column_totals(view(padded), view(valid), row_block)
    p, m, c = (np.zeros(G, np.float64) for _ in range(3))
    for lane in range(lanes):
        p, m, c = p + P[:, lane], m + M[:, lane], c + C[:, lane]
    return p, m, c


def values(g: np.ndarray, r: np.ndarray | None, acc) -> np.ndarray:
    """v = g (+ r), each loaded into the arithmetic type, one rounding for the sum."""
    v = g.astype(acc)
    if r is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            v = v + r.astype(acc)
    return v


def scales(g: np.ndarray, r: np.ndarray | None, groups: int, by_rows: bool, dtype_name: str,
           row_block: int = ROW_BLOCK, lanes: int = LANES) -> np.ndarray:
    """onebit_scales(g, r, groups, by_rows) of the flat g (and residual r; values exact in float32
    or float64 arrays): float32 [a+ of each group..., a- of each group...], a group being a column
    of the [n / groups, groups] matrix (one column when groups == 1) or, by_rows, a row of the
    [groups, n / groups] matrix."""
    v = values(g, r, acc_type(dtype_name))
    n = v.shape[0]
    if by_rows:
        width = n // groups if groups else 0
        p, m, c = one_column_totals(v.reshape(groups, width), row_block, lanes)
        a_pos, a_neg = finish(p, m, c, width)
    elif groups == 1:
        p, m, c = one_column_totals(v.reshape(1, n), row_block, lanes)
        a_pos, a_neg = finish(p, m, c, n)
    else:
        rows = n // groups
        p, m, c = column_totals(v.reshape(rows, groups), None, row_block)
        a_pos, a_neg = finish(p, m, c, rows)
    return np.concatenate([a_pos, a_neg]).astype(np.float32)
