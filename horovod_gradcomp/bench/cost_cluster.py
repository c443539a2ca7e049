"""The cost model for one user's cluster and model: a table per codec and pattern, and a recommendation.

``python -m horovod_gradcomp.bench model --nodes N --gpus-per-node L --inter-node-gbit B
--params P`` prints this. It is the node model of :mod:`horovod_gradcomp.bench.cost_nodes`
(flat and hierarchical codec exchanges, the fp32 ring and NCCL-style hierarchical allreduce)
at one layout, with the fp16 allreduce added and the codec inputs scaled to the user's model:

* ``scale``: the inputs were measured on one model (ResNet-50's 25,557,032 values unless
  ``--calibrate`` measured them here); every codec time, every payload size and the fp16 casts
  are taken as linear in the number of values, so a model of ``n`` values gets them times
  ``n / n_measured`` (the codecs are one or two passes over the gradient: memory-bound work);
* fp16 allreduce, flat: ``2 (K-1)/K x 2 n`` bytes over the NIC, plus the casts to and from
  half precision; hierarchical: ``2 (L-1)/L x 2 n`` inside the node, ``2 (N-1)/N x 2 n / L``
  per NIC between nodes, plus the casts; latency as the fp32 allreduce's;
* PowerSGD rank 1 and 4 (DDP's hook), when the model's shapes are known: :mod:`.cost_powersgd`.

It prices the *exchange* of one step (the compute of a step does not depend on the method),
one bucket, no overlap with backward. The recommendation (:func:`recommend`) is the fastest
exchange, except that a codec must beat the fastest dense exchange by ``min_speedup`` (1.25
by default): compression changes what the optimizer sees (error feedback, quantization noise;
the results pages measure a few percent of loss at some defaults), so a small gain on the
wire does not pay for it, and then dense is fine.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional, Sequence, Tuple

from .cost_model import POWERSGD_RANKS, Inputs
from .cost_nodes import methods as node_methods
from .cost_nodes import predict_nodes
from .cost_powersgd import predict_powersgd

#: A codec must make the exchange at least this many times faster than dense to be recommended.
MIN_SPEEDUP = 1.25
DENSE = ("fp32", "fp16")


def scale_inputs(inputs: Inputs, numel: int) -> Inputs:
    """``inputs`` for a model of ``numel`` values: every codec time and payload size, and the
    fp16 casts, times ``numel / inputs.numel``; no compute, in-situ step, contention or
    PowerSGD figure (those belong to the measured model and machine)."""
    if numel < 1:
        raise ValueError(f"the model must have at least one value, got {numel}")
    f = numel / inputs.numel
    codecs = {key: {name: (value * f if name.endswith("_ms") or name == "bytes" else value)
                    for name, value in c.items()} for key, c in inputs.codecs.items()}
    fp16 = {"encode_ms": inputs.fp16["encode_ms"] * f, "decode_ms": inputs.fp16["decode_ms"] * f}
    return dataclasses.replace(inputs, numel=numel, compute_ms=0.0, codecs=codecs, fp16=fp16, powersgd={},
                               in_situ={}, contention={}, in_situ_cpu={},
                               source=f"{inputs.source} (scaled x{f:.3g} from {inputs.numel:,} values)")


def predict_fp16(pattern: str, nodes: int, per_node: int, inputs: Inputs, *, inter_bits_per_s: float,
                 intra_bytes_per_s: float, alpha_s: float) -> Dict[str, float]:
    """PREDICTED ms of the fp16 allreduce's exchange, ``pattern`` ``flat`` or ``hierarchical``
    (module docstring), in :func:`~horovod_gradcomp.bench.cost_nodes.predict_nodes`'s keys."""
    k, n2 = nodes * per_node, 2.0 * inputs.numel
    if pattern == "flat":
        inter, intra, msgs = 2.0 * (k - 1) / k * n2, 0.0, 2 * (k - 1)
    elif pattern == "hierarchical":
        inter = 2.0 * (nodes - 1) / nodes * n2 / per_node
        intra = 2.0 * (per_node - 1) / per_node * n2
        msgs = 2 * (nodes - 1) + 2 * (per_node - 1)
    else:
        raise ValueError(f"unknown fp16 pattern {pattern!r}")
    codec_ms = inputs.fp16["encode_ms"] + inputs.fp16["decode_ms"]
    inter_ms = 1e3 * 8 * inter / inter_bits_per_s if k > 1 else 0.0
    intra_ms = 1e3 * intra / intra_bytes_per_s
    latency_ms = 1e3 * msgs * alpha_s
    return {"method": f"fp16/{pattern}", "nodes": nodes, "per_node": per_node, "codec_ms": codec_ms,
            "intra_ms": intra_ms, "inter_ms": inter_ms, "latency_ms": latency_ms, "inter_bytes": inter,
            "intra_bytes": intra, "exchange_ms": codec_ms + intra_ms + inter_ms + latency_ms}


def cluster_methods(per_node: int) -> List[str]:
    """Every label priced for a layout: the node model's, plus the fp16 allreduce; the
    hierarchical patterns only where a node has more than one GPU (else they are the flat ones)."""
    labels = node_methods()
    labels[2:2] = ["fp16/flat", "fp16/hierarchical"]
    return [m for m in labels if per_node > 1 or "hierarchical" not in m]


def cluster_rows(inputs: Inputs, nodes: int, per_node: int, inter_gbit: float, intra_gbyte: float,
                 alpha_s: float = 25e-6, powersgd: Optional[Tuple[Sequence, Tuple[float, float]]] = None) -> List[dict]:
    """PREDICTED exchange of every :func:`cluster_methods` label on ``nodes`` x ``per_node``
    GPUs, ``inter_gbit`` Gbit/s per GPU between nodes and ``intra_gbyte`` GB/s inside a node,
    for the model ``inputs`` describe (already scaled: :func:`scale_inputs`), and with
    ``powersgd`` = (the model's shapes, :func:`~horovod_gradcomp.bench.cost_powersgd.coefficients`)
    PowerSGD at ranks 1 and 4 (:mod:`.cost_powersgd`); fastest first."""
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and GPUs per node must be >= 1, got {nodes} x {per_node}")
    if not (inter_gbit > 0 and intra_gbyte > 0):
        raise ValueError(f"link rates must be > 0, got {inter_gbit} Gbit/s and {intra_gbyte} GB/s")
    rates = dict(inter_bits_per_s=inter_gbit * 1e9, intra_bytes_per_s=intra_gbyte * 1e9, alpha_s=alpha_s)
    rows = []
    for m in cluster_methods(per_node):
        if m.startswith("fp16/"):
            rows.append(predict_fp16(m.split("/")[1], nodes, per_node, inputs, **rates))
        else:
            rows.append(predict_nodes(m, nodes, per_node, inputs, **rates))
    if powersgd is not None:
        shapes, coeffs = powersgd
        rows += [predict_powersgd(r, shapes, nodes, per_node, coeffs, inter_bits_per_s=rates["inter_bits_per_s"],
                                  alpha_s=alpha_s) for r in POWERSGD_RANKS]
    return sorted(rows, key=lambda r: r["exchange_ms"])


def is_dense(method: str) -> bool:
    """Whether ``method`` is a dense allreduce (no codec)."""
    return method.split("/")[0] in DENSE


def recommend(rows: List[dict], min_speedup: float = MIN_SPEEDUP) -> Tuple[str, str]:
    """(method, reason): the fastest dense exchange unless a codec's is at least
    ``min_speedup`` times faster, in which case that codec; the reason gives the figures."""
    if min_speedup < 1:
        raise ValueError(f"min_speedup must be >= 1, got {min_speedup}")
    dense = min((r for r in rows if is_dense(r["method"])), key=lambda r: r["exchange_ms"])
    codecs = [r for r in rows if not is_dense(r["method"])]
    best = min(codecs, key=lambda r: r["exchange_ms"]) if codecs else None
    d_ms = dense["exchange_ms"]
    if best is None or best["exchange_ms"] >= d_ms:
        why = "" if best is None else (
            f" the fastest codec exchange, {best['method']}, takes {best['exchange_ms']:.1f} ms: "
            f"its codec time ({best['codec_ms']:.1f} ms) costs more than it saves on the wire")
        return dense["method"], (f"dense is fine here: {dense['method']} takes {d_ms:.1f} ms per step (of which "
                                 f"{dense['inter_ms']:.1f} ms between nodes);{why}.")
    speedup = d_ms / best["exchange_ms"] if best["exchange_ms"] > 0 else math.inf
    if speedup < min_speedup:
        return dense["method"], (f"dense is fine here: {dense['method']} takes {d_ms:.1f} ms per step; the fastest "
                                 f"codec exchange, {best['method']}, {best['exchange_ms']:.1f} ms, is only "
                                 f"{speedup:.2f}x faster (less than the {min_speedup:g}x that pays for compression's "
                                 "effect on training).")
    return best["method"], (f"{best['method']} takes {best['exchange_ms']:.1f} ms per step against "
                            f"{d_ms:.1f} ms for the fastest dense exchange ({dense['method']}, "
                            f"{dense['inter_ms']:.1f} ms of it between nodes): {speedup:.1f}x faster, at least "
                            f"the {min_speedup:g}x asked of a codec.")


def format_cluster(rows: List[dict], choice: Tuple[str, str], header: str,
                   note: Optional[str] = None) -> str:
    """Markdown: ``header``, the table of ``rows`` (fastest first), ``note``, the recommendation."""
    out = [header, "",
           "| method/pattern | exchange ms | codec ms | inside node ms | between nodes ms | latency ms | "
           "bytes per NIC |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"**{r['method']}**" if r["method"] == choice[0] else r["method"]
        out.append(f"| {name} | {r['exchange_ms']:.1f} | {r['codec_ms']:.1f} | {r['intra_ms']:.1f} | "
                   f"{r['inter_ms']:.1f} | {r['latency_ms']:.2f} | {r['inter_bytes']:,.0f} |")
    if note:
        out += ["", note]
    out += ["", f"Recommendation: {choice[0]}. Reason: {choice[1]}"]
    return "\n".join(out)


__all__ = ["MIN_SPEEDUP", "cluster_methods", "cluster_rows", "format_cluster", "is_dense", "predict_fp16",
           "recommend", "scale_inputs"]
