"""FSDP2's gradient reduce-scatter in the cost model (``bench model --nodes N``): dense against
compressed, sharded over every GPU or HSDP (sharded inside the node, replicated across nodes).

PREDICTED, per GPU and step, the gradient exchange only (FSDP2's parameter all-gathers are the same
for every row and left out), from the same inputs and links as :mod:`.cost_nodes`, for a model of
``n`` values on N nodes of L GPUs (K = N L):

* ``fsdp2-fp32/sharded``, ``fsdp2-bf16/sharded``: FSDP2's own ring reduce-scatter over K ranks,
  ``(K-1)/K`` of the gradient's bytes (4 n, or 2 n with ``reduce_dtype=bfloat16``, plus the
  casts, priced as the fp16 casts) and K-1 messages; as the node model's flat rows, every byte
  is counted over the NIC;
* ``<codec>/fsdp2-sharded`` (:mod:`horovod_gradcomp.exchange.reduce_scatter`): every GPU encodes
  the whole gradient once (its K chunks; the payload is the codec's payload of the model) and
  sends K-1 of the K chunk payloads in one alltoallv: ``(K-1)/K`` of the payload; owner j decodes
  the K payloads of its 1/K and sums them, decoded once (no second quantization). Codec time:
  one encode of the model plus the decode-mean of K payloads of 1/K of it. Messages: the
  alltoallv's K-1, the preamble's ``ceil(log2 K)``, the variable-size codecs' sizes (K-1 more),
  TernGrad's shared-scale allreduce (``ceil(log2 K)``). The per-segment scales of the K chunks
  (K times a per-tensor scale count) are not added;
* ``fsdp2-fp32/hsdp``: FSDP2's own HSDP, the reduce-scatter inside the node (``(L-1)/L x 4 n``
  at the intra rate, L-1 messages), then a ring all-reduce of the 1/L shard among the N nodes;
* ``<codec>/fsdp2-hsdp-<inner>`` (:mod:`horovod_gradcomp.fsdp.hsdp`): the same reduce-scatter
  inside the node, then the codec's ``inner`` pattern (allgather or two-phase) on the shard
  among the N replicas: the node model's hierarchical row
  (:func:`~horovod_gradcomp.bench.cost_nodes.predict_nodes`) with its inside-node term halved
  (a reduce-scatter, not a reduce-scatter and an allgather).

The error-feedback residual these rows imply is the node model's business no more than the
others': in sharded mode it is the size of the unsharded gradient on every GPU, in HSDP mode the
size of the shard (docs/guide/fsdp.md).
"""
from __future__ import annotations

import math
from typing import Dict, List

from .cost_model import CODECS, VARIABLE, Inputs, dmean
from .cost_nodes import node_row, predict_nodes


def fsdp_methods(nodes: int, per_node: int) -> List[str]:
    """The FSDP2 labels priced for a layout: sharded always; HSDP when there are several nodes
    of several GPUs (otherwise it is the sharded layout)."""
    out = ["fsdp2-fp32/sharded", "fsdp2-bf16/sharded"] + [f"{key}/fsdp2-sharded" for key in CODECS]
    if nodes > 1 and per_node > 1:
        out.append("fsdp2-fp32/hsdp")
        for key in CODECS:
            inner = ["allgather"] if key in VARIABLE else ["allgather", "two_phase"]
            out += [f"{key}/fsdp2-hsdp-{p}" for p in inner]
    return out


def predict_fsdp(method: str, nodes: int, per_node: int, inputs: Inputs, *, inter_bits_per_s: float,
                 intra_bytes_per_s: float, alpha_s: float = 25e-6) -> Dict[str, float]:
    """PREDICTED ms of one step's gradient reduce-scatter of ``method`` (a :func:`fsdp_methods`
    label) on ``nodes`` x ``per_node`` GPUs, in :func:`~horovod_gradcomp.bench.cost_nodes.predict_nodes`'s
    keys (``inter_bytes``: bytes each GPU sends over its NIC; ``intra_bytes``: inside the node)."""
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be >= 1, got {nodes} x {per_node}")
    if method not in fsdp_methods(nodes, per_node):
        raise ValueError(f"unknown FSDP2 method {method!r} at {nodes} x {per_node}; known: "
                         f"{fsdp_methods(nodes, per_node)}")
    rates = dict(inter_bits_per_s=inter_bits_per_s, intra_bytes_per_s=intra_bytes_per_s, alpha_s=alpha_s)
    k, n = nodes * per_node, float(inputs.numel)
    log_k = math.ceil(math.log2(k)) if k > 1 else 0
    key, pattern = method.split("/")
    if pattern == "sharded":
        width = 4.0 if key == "fsdp2-fp32" else 2.0
        casts = 0.0 if width == 4.0 else inputs.fp16["encode_ms"] + inputs.fp16["decode_ms"]
        return node_row(method, nodes, per_node, casts, 0.0, (k - 1) / k * width * n, k - 1, **rates)
    if pattern == "fsdp2-sharded":
        c = inputs.codecs[key]
        msgs = (k - 1) + log_k + (k - 1 if key in VARIABLE else 0) + (log_k if key == "terngrad" else 0)
        codec_ms = c["encode_ms"] + dmean(c, k) / k
        return node_row(method, nodes, per_node, codec_ms, 0.0, (k - 1) / k * c["bytes"], msgs, **rates)
    # HSDP: the node model's hierarchical row, whose inside-node term is an allreduce (a reduce-scatter
    # and an allgather, 2 (L-1) messages); FSDP2 runs only the reduce-scatter there.
    base = "fp32/hierarchical" if key == "fsdp2-fp32" else f"{key}/hierarchical-{pattern[len('fsdp2-hsdp-'):]}"
    r = predict_nodes(base, nodes, per_node, inputs, **rates)
    msgs = r["latency_ms"] / (1e3 * alpha_s) - (per_node - 1) if alpha_s else 0.0
    return node_row(method, nodes, per_node, r["codec_ms"], r["intra_bytes"] / 2, r["inter_bytes"], msgs, **rates)


def fsdp_rows(inputs: Inputs, nodes: int, per_node: int, inter_gbit: float, intra_gbyte: float,
              alpha_s: float = 25e-6) -> List[dict]:
    """Every :func:`fsdp_methods` row for the layout and links (``inputs`` already scaled to the
    model, :func:`~horovod_gradcomp.bench.cost_cluster.scale_inputs`), fastest first."""
    rates = dict(inter_bits_per_s=inter_gbit * 1e9, intra_bytes_per_s=intra_gbyte * 1e9, alpha_s=alpha_s)
    rows = [predict_fsdp(m, nodes, per_node, inputs, **rates) for m in fsdp_methods(nodes, per_node)]
    return sorted(rows, key=lambda r: r["exchange_ms"])


def format_fsdp(rows: List[dict]) -> str:
    """Markdown: the FSDP2 rows (fastest first, in bold), with each GPU's bytes over its NIC and
    inside its node."""
    best = rows[0]["method"] if rows else None
    out = ["FSDP2's gradient reduce-scatter (PREDICTED; the parameter all-gathers, the same for every row, "
           "left out; bench/cost_fsdp.py):", "",
           "| method/pattern | exchange ms | codec ms | inside node ms | between nodes ms | latency ms | "
           "bytes per GPU over the NIC | bytes per GPU inside the node |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        name = f"**{r['method']}**" if r["method"] == best else r["method"]
        out.append(f"| {name} | {r['exchange_ms']:.1f} | {r['codec_ms']:.1f} | {r['intra_ms']:.1f} | "
                   f"{r['inter_ms']:.1f} | {r['latency_ms']:.2f} | {r['inter_bytes']:,.0f} | {r['intra_bytes']:,.0f} |")
    return "\n".join(out)


__all__ = ["format_fsdp", "fsdp_methods", "fsdp_rows", "predict_fsdp"]
