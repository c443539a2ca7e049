"""PowerSGD in the cluster form of the cost model (``bench model --nodes N`` with the model's shapes).

PyTorch's PowerSGD hook compresses each matrix M (n x m, a tensor viewed as shape[0] rows) where
``(n + m) r * 2 < n m`` and allreduces the rest whole
(:func:`~horovod_gradcomp.bench.cost_model.powersgd_factor_bytes`).
Its arithmetic per compressed matrix is the error feedback (passes over the n m values) and the
products M Q, M^T P, P Q^T (n m r multiply-adds each), so its time is modelled as

    powersgd(r) = a * W(r) + b * r * W(r),   W(r) = the sum of n m over the matrices compressed at r

with ``a`` and ``b`` (ms per value and per value and rank) solved from the two measured
figures of the inputs (rank 1 and rank 4 on ResNet-50's shapes). Its exchange is the flat ring
allreduce of the P and Q factors and of the uncompressed tensors, ``2 (K-1)/K`` of those fp32
bytes over the NIC, in three allreduces (``3 x 2 (K-1)`` messages). It needs the model's shapes
(``--shapes-file`` or ``--model``): a parameter count alone does not say which tensors are
matrices.
"""
from __future__ import annotations

import math
from typing import Dict, List, Sequence, Tuple

from .cost_model import MIN_COMPRESSION_RATE, POWERSGD_RANKS, Inputs, powersgd_factor_bytes


def compressed_matrices(shapes: Sequence[Tuple[int, ...]], rank: int) -> List[Tuple[int, int, int]]:
    """(n, m, r) of each tensor the hook compresses at ``rank``: viewed as an n x m matrix (first
    dimension by the rest), its rank r = min(rank, n, m) factors beat the matrix by
    MIN_COMPRESSION_RATE. Vectors and the tensors that do not gain so much go uncompressed."""
    found = []
    for s in shapes:
        if len(s) < 2:
            continue
        n, m = s[0], math.prod(s) // s[0]
        r = min(rank, n, m)
        if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
            found.append((n, m, r))
    return found


def matrix_values(shapes: Sequence[Tuple[int, ...]], rank: int) -> int:
    """W(rank): the values of the matrices the hook compresses at ``rank``."""
    return sum(n * m for n, m, _ in compressed_matrices(shapes, rank))


def coefficients(inputs: Inputs, measured_shapes: Sequence[Tuple[int, ...]]) -> Tuple[float, float]:
    """(a, b) of the module's formula from the inputs' rank-1 and rank-4 figures, measured on
    ``measured_shapes``. ValueError when the inputs lack them or describe other shapes."""
    if not all(r in inputs.powersgd for r in (1, 4)):
        raise ValueError("the inputs have no PowerSGD figures at rank 1 and 4 (bench model --measure writes them)")
    if sum(math.prod(s) for s in measured_shapes) != inputs.numel:
        raise ValueError(f"the inputs' PowerSGD figures are for a model of {inputs.numel:,} values, not the "
                         f"{sum(math.prod(s) for s in measured_shapes):,} of the shapes they are taken as measured on")
    w1, w4 = matrix_values(measured_shapes, 1), matrix_values(measured_shapes, 4)
    t1, t4 = inputs.powersgd[1]["compute_ms"], inputs.powersgd[4]["compute_ms"]
    # t1 = a w1 + b w1, t4 = a w4 + 4 b w4
    b = (t4 / w4 - t1 / w1) / 3
    a = t1 / w1 - b
    return a, b


def predict_powersgd(rank: int, shapes: Sequence[Tuple[int, ...]], nodes: int, per_node: int,
                     coeffs: Tuple[float, float], *, inter_bits_per_s: float, alpha_s: float) -> Dict[str, float]:
    """PREDICTED exchange of PowerSGD at ``rank`` on ``nodes`` x ``per_node`` GPUs, in
    :func:`~horovod_gradcomp.bench.cost_nodes.predict_nodes`'s keys."""
    k = nodes * per_node
    a, b = coeffs
    w = matrix_values(shapes, rank)
    codec_ms = max(0.0, a * w + b * rank * w)
    inter = 2.0 * (k - 1) / k * powersgd_factor_bytes(shapes, rank) if k > 1 else 0.0
    inter_ms = 1e3 * 8 * inter / inter_bits_per_s
    latency_ms = 1e3 * 3 * 2 * (k - 1) * alpha_s
    return {"method": f"powersgd{rank}/flat", "nodes": nodes, "per_node": per_node, "codec_ms": codec_ms,
            "intra_ms": 0.0, "inter_ms": inter_ms, "latency_ms": latency_ms, "inter_bytes": inter, "intra_bytes": 0.0,
            "exchange_ms": codec_ms + inter_ms + latency_ms}


__all__ = ["POWERSGD_RANKS", "coefficients", "matrix_values", "predict_powersgd"]
