"""The cost model on N nodes of L GPUs: flat against hierarchical exchanges (``bench model --nodes``).

PREDICTED, from the measured inputs of :mod:`horovod_gradcomp.bench.cost_model` (codec times
on one core of the machine that measured them, payload bytes of ResNet-50). It prices the
*exchange* of one step (the step minus its compute, which the pattern does not change), one
bucket, no overlap with backward, per GPU:

* links: each GPU has its own NIC at ``inter`` bits/s (the L NICs of a node, as on GPU nodes
  with one NIC per GPU), and reaches the GPUs of its node at ``intra`` bytes/s (NVLink or PCIe);
* flat (every codec, allgather and two-phase; K = N L ranks as one network): the single-node
  model's codec and wire terms (:func:`~horovod_gradcomp.bench.cost_model.predict` with K, its
  compute taken out), every byte over the NIC;
* hierarchical (:mod:`horovod_gradcomp.exchange.hierarchical`): the dense reduce-scatter and
  allgather inside the node, ``2 (L-1)/L x 4 n`` bytes at the intra rate; between nodes the
  inner pattern on a shard of 1/L among N: allgather ``(N-1) S/L``, two-phase ``2 (N-1)/N S/L``
  (TernGrad's exact sums as in the flat model); codec time the flat pattern's at K = N, over L
  (each GPU encodes and decodes 1/L of the model);
* dense baselines: the flat ring allreduce of fp32 (``2 (K-1)/K x 4 n`` over the NIC) and the
  NCCL-style hierarchical allreduce (reduce-scatter and allgather inside the node, a ring
  allreduce of 1/L of the fp32 gradient among the N nodes: ``2 (N-1)/N x 4 n / L`` per NIC);
* latency ``alpha`` per message: the ring's K-1 (allgather) or 2 (K-1) (allreduce, two-phase)
  messages, the node steps' 2 (L-1), the preamble's and Horovod's placeholder ``ceil(log2 K)`` each.

Left out: the node sum (L-1 additions of n/L values, memory-bound), the staging copies between
device and host, contention between the L GPUs of a node for one PCIe switch or NIC, congestion
in the fabric (a full bisection is assumed), pipelined chunks, and the GPU codec kernels' own
speed (the CPU figures of the inputs are used: on GPUs the codec terms are smaller, which favours
the patterns that send less). ``bench model --nodes --check`` (:mod:`.cost_nodes_check`) compares
it with the harness of real nodes (namespaces on one CPU machine), priced for that harness.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Sequence

from ..codecs.ternary_sum import level_width
from .cost_model import CODECS, EXACT_SUM, VARIABLE, Inputs, dmean, predict

#: Default links: 25 Gbit/s NICs, NVLink-class 150 GB/s inside the node.
INTER_GBIT = 25.0
INTRA_GBYTE = 150.0
NODES = (2, 4, 8, 16, 32, 64)
PER_NODE = 8


def methods() -> List[str]:
    """Labels the node model prices: dense baselines, then per codec flat and hierarchical patterns."""
    out = ["fp32/flat", "fp32/hierarchical"]
    for key in CODECS:
        inner = ["allgather"] if key in VARIABLE else ["allgather", "two_phase"]
        out += [f"{key}/{p}" for p in inner] + [f"{key}/hierarchical-{p}" for p in inner]
    return out


def predict_nodes(method: str, nodes: int, per_node: int, inputs: Inputs, *, inter_bits_per_s: float,
                  intra_bytes_per_s: float, alpha_s: float = 25e-6) -> Dict[str, float]:
    """PREDICTED ms of one step's exchange of ``method`` (a :func:`methods` label) on ``nodes``
    x ``per_node`` GPUs: ``exchange_ms`` and its terms (``codec_ms``, ``intra_ms``, ``inter_ms``,
    ``latency_ms``), and ``inter_bytes`` (per NIC) and ``intra_bytes`` (per GPU)."""
    if nodes < 1 or per_node < 1:
        raise ValueError(f"nodes and per_node must be >= 1, got {nodes} x {per_node}")
    k, n4 = nodes * per_node, 4.0 * inputs.numel
    log_k = math.ceil(math.log2(k)) if k > 1 else 0
    key, pattern = method.split("/")
    dense_intra = 2.0 * (per_node - 1) / per_node * n4
    intra_msgs = 2 * (per_node - 1)
    codec_ms = intra = 0.0
    if key == "fp32":
        if pattern == "flat":
            inter, msgs = 2.0 * (k - 1) / k * n4, 2 * (k - 1)
        else:
            inter, msgs, intra = 2.0 * (nodes - 1) / nodes * n4 / per_node, 2 * (nodes - 1) + intra_msgs, dense_intra
    elif pattern.startswith("hierarchical-"):
        inner = pattern[len("hierarchical-"):]
        c = inputs.codecs[key]
        shard = c["bytes"] / per_node
        msgs = 2 * log_k + intra_msgs
        intra = dense_intra
        if inner == "allgather":
            inter = (nodes - 1) * shard
            msgs += (nodes - 1) * (2 if key in VARIABLE else 1)
            codec_ms = (c["encode_ms"] + dmean(c, nodes)) / per_node
        elif key in EXACT_SUM:
            inter = (nodes - 1) / nodes * shard * (1 + level_width(nodes) / 2)
            msgs += 2 * (nodes - 1)
            codec_ms = (c["encode_ms"] + dmean(c, nodes) / nodes + c["decode_ms"]) / per_node
        else:
            inter = 2.0 * (nodes - 1) / nodes * shard
            msgs += 2 * (nodes - 1)
            codec_ms = ((1 + 1 / nodes) * c["encode_ms"] + dmean(c, nodes) / nodes + c["decode_ms"]) / per_node
        if nodes == 1:
            inter = 0.0
    else:   # a flat pattern: the single-node model at K, without its compute
        isolated = dataclasses.replace(inputs, in_situ={}, in_situ_cpu={}, contention={})  # codec terms alone
        flat = predict(method, k, inter_bits_per_s, isolated, alpha_s=alpha_s, pipeline_bytes=None)
        codec_ms, inter = flat["cpu_ms"] - inputs.compute_ms, flat["bytes_per_rank"]
        msgs = flat["latency_ms"] / (1e3 * alpha_s) if alpha_s else 0
    return node_row(method, nodes, per_node, codec_ms, intra, inter, msgs, inter_bits_per_s=inter_bits_per_s,
                    intra_bytes_per_s=intra_bytes_per_s, alpha_s=alpha_s)


def node_row(method: str, nodes: int, per_node: int, codec_ms: float, intra: float, inter: float, msgs: float, *,
             inter_bits_per_s: float, intra_bytes_per_s: float, alpha_s: float) -> Dict[str, float]:
    """One predicted row from its terms: ``codec_ms``, ``intra`` bytes inside the node, ``inter``
    bytes over the NIC and ``msgs`` message latencies, each turned into ms at the given rates."""
    inter_ms = 1e3 * 8 * inter / inter_bits_per_s if nodes * per_node > 1 else 0.0
    intra_ms = 1e3 * intra / intra_bytes_per_s
    latency_ms = 1e3 * msgs * alpha_s
    return {"method": method, "nodes": nodes, "per_node": per_node, "codec_ms": codec_ms, "intra_ms": intra_ms,
            "inter_ms": inter_ms, "latency_ms": latency_ms, "inter_bytes": inter, "intra_bytes": intra,
            "exchange_ms": codec_ms + intra_ms + inter_ms + latency_ms}


def nodes_table(inputs: Inputs, nodes: Sequence[int] = NODES, per_node: int = PER_NODE,
                inter_gbit: float = INTER_GBIT, intra_gbyte: float = INTRA_GBYTE, alpha_s: float = 25e-6) -> str:
    """Markdown: PREDICTED exchange ms per step of every method (rows) at every node count
    (columns), the fastest in bold."""
    preds = {m: [predict_nodes(m, nn, per_node, inputs, inter_bits_per_s=inter_gbit * 1e9,
                               intra_bytes_per_s=intra_gbyte * 1e9, alpha_s=alpha_s)["exchange_ms"] for nn in nodes]
             for m in methods()}
    best = [min(preds[m][j] for m in preds) for j in range(len(nodes))]
    out = [f"### {per_node} GPUs per node, {inter_gbit:g} Gbit/s per GPU between nodes, {intra_gbyte:g} GB/s inside "
           "(PREDICTED exchange ms per step, compute excluded)", "",
           "| method | " + " | ".join(f"N={nn} (K={nn * per_node})" for nn in nodes) + " |",
           "|---|" + "---|" * len(nodes)]
    for m, vals in preds.items():
        cells = [f"**{v:.1f}**" if v == best[j] else f"{v:.1f}" for j, v in enumerate(vals)]
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(out)


__all__ = ["INTER_GBIT", "INTRA_GBYTE", "NODES", "PER_NODE", "methods", "nodes_table", "predict_nodes"]
