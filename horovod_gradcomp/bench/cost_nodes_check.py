"""The node model (:mod:`.cost_nodes`) against the harness of real nodes (``bench model --nodes --check``).

The harness (``bench exchange --net bridge --per-node L``) is not the GPU node the model is
written for, in three ways that the check prices before comparing:

* one link per node, not per GPU: the L ranks of a namespace share its rate-limited veth link,
  so a node's link carries the sum of its ranks' bytes to other nodes;
* the flat patterns send to every peer, and on the harness only the peers on other nodes are
  across the link: a fraction (K - L) / (K - 1) of a rank's bytes (the rest goes through shared
  memory); Horovod's fp32 allreduce is Open MPI's ring, whose K edges cross between nodes N
  times, so a node's link carries one rank's ring bytes, 2 (K - 1) / K x 4 n;
* K ranks share the machine's cores: every CPU term is multiplied by max(1, K / cores), as the
  flat check does;
* on CPUs the step has costs the GPU model leaves out, priced from measured inputs: the
  framework's work around the codec (hooks, the non-finite pass, packing, writing results:
  the in-situ step of the flat method at -np 2, minus its compute and isolated codec time; the
  hierarchical pattern pays its inner flat method's), and the node steps' copies (the scatter's
  send buffer, the node sum, the gather's part and write-back: :data:`NODE_COPY_PASSES` passes
  over the fp32 gradient at the harness's measured copy rate).

The inside of a node runs at ``intra`` bytes per second and memory copies at ``copy`` bytes per
second, both measured on the harness itself (:func:`measure_intra`: an alltoallv of the bucket's
fp32 bytes between the two ranks of one namespace, and a copy of them). The compute of a step
is the ``local`` config of the same run (no communication), so the check compares exchange
times: measured step minus that compute, against the prediction.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Dict, List, Sequence, Tuple

from . import exchange_bench as eb
from . import slownet
from .cost_measure import exchange_args
from .cost_model import Inputs
from .cost_nodes import predict_nodes

#: ``bench exchange`` config -> node-model method, for the check's runs.
CHECK_METHODS: Dict[str, str] = {
    "none": "fp32/flat",
    "onebit:pattern=allgather": "onebit/allgather",
    "onebit:pattern=two_phase": "onebit/two_phase",
    "onebit:pattern=hierarchical,inner_pattern=allgather": "onebit/hierarchical-allgather",
    "dgc:density=0.001,pattern=allgather": "dgc/allgather",
    "dgc:density=0.001,pattern=hierarchical,inner_pattern=allgather": "dgc/hierarchical-allgather",
}
#: (N nodes, L ranks per node) the issue asks the model to be checked at.
LAYOUTS: Tuple[Tuple[int, int], ...] = ((2, 1), (1, 2), (2, 2))


#: Passes over a bucket's fp32 bytes that a rank's node steps copy when L > 1 (send buffer,
#: node sum with its reads, the gather's part, the write-back into the gradients).
NODE_COPY_PASSES = 3.0


def framework_ms(method: str, inputs: Inputs) -> float:
    """The in-situ step of ``method``'s flat pattern (its inner pattern for a hierarchical one) at
    -np 2 minus the compute and the isolated codec time there: the work around the codec; 0
    without an in-situ figure (fp32: Horovod's own allreduce)."""
    key, pattern = method.split("/")
    flat = f"{key}/{pattern[len('hierarchical-'):] if pattern.startswith('hierarchical-') else pattern}"
    if flat not in inputs.in_situ:
        return 0.0
    isolated = predict_nodes(flat, 2, 1, inputs, inter_bits_per_s=1e18, intra_bytes_per_s=1e18, alpha_s=0.0)
    return max(0.0, inputs.in_situ[flat] - inputs.compute_ms - isolated["codec_ms"])


def predict_harness(method: str, nodes: int, per_node: int, inputs: Inputs, *, rate_bits_per_s: float,
                    intra_bytes_per_s: float, cores: float, alpha_s: float = 25e-6,
                    copy_bytes_per_s: float = 0.0) -> Dict[str, float]:
    """PREDICTED exchange ms of one step of ``method`` on the harness's ``nodes`` x ``per_node``
    layout (module docstring): the node model's terms with one shared link per node, the flat
    patterns' on-node bytes through shared memory, the framework's work and the node copies
    (with ``copy_bytes_per_s``; none when 0), all CPU terms on ``cores``."""
    k = nodes * per_node
    p = predict_nodes(method, nodes, per_node, inputs, inter_bits_per_s=rate_bits_per_s,
                      intra_bytes_per_s=intra_bytes_per_s, alpha_s=alpha_s)
    key, pattern = method.split("/")
    per_rank = p["inter_bytes"]          # what the model puts on one GPU's NIC
    if nodes == 1:
        link, on_node = 0.0, per_rank    # one namespace: nothing crosses a link
    elif pattern.startswith("hierarchical"):
        link, on_node = per_node * per_rank, 0.0
    elif key == "fp32":                  # Open MPI's ring: one crossing edge per node
        link, on_node = per_rank, per_rank * (k - 2) / k
    else:                                # direct exchanges with every peer
        crossing = (k - per_node) / (k - 1)
        link, on_node = per_node * per_rank * crossing, per_rank * (1 - crossing)
    share = max(1.0, k / cores)
    codec_ms = p["codec_ms"] * share
    work_ms = framework_ms(method, inputs) * share
    copies = NODE_COPY_PASSES * 4.0 * inputs.numel if pattern.startswith("hierarchical") and per_node > 1 else 0.0
    copy_ms = 1e3 * copies / copy_bytes_per_s * share if copy_bytes_per_s else 0.0
    intra_ms = 1e3 * (p["intra_bytes"] + on_node) / intra_bytes_per_s
    link_ms = 1e3 * 8 * link / rate_bits_per_s
    return {"codec_ms": codec_ms, "framework_ms": work_ms, "copy_ms": copy_ms, "intra_ms": intra_ms,
            "link_ms": link_ms, "latency_ms": p["latency_ms"], "link_bytes": link,
            "exchange_ms": codec_ms + work_ms + copy_ms + intra_ms + link_ms + p["latency_ms"]}


def measure_intra(numel: int, timeout: float) -> Tuple[float, float]:
    """(intra, copy) bytes per second on the harness, the best of 5 each, with two ranks in one
    namespace doing the same at once: an alltoallv of ``numel`` fp32 values between them (each
    sends half, as the hierarchical pattern's node scatter does; counted as the bytes one rank
    sends and receives), and a copy of those values (bytes written)."""
    script = (
        "import time, numpy as np\nfrom mpi4py import MPI\n"
        "c = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED)\n"
        f"n = {int(numel)}; h = n // 2; x = np.ones(n, np.float32); y = np.empty(2 * h, np.float32)\n"
        "best = cbest = 1e9\n"
        "for _ in range(5):\n"
        "    c.Barrier(); t = time.perf_counter()\n"
        "    c.Alltoallv([x, [h, h], [0, h], MPI.FLOAT], [y, [h, h], [0, h], MPI.FLOAT])\n"
        "    best = min(best, time.perf_counter() - t)\n"
        "    c.Barrier(); t = time.perf_counter(); z = x.copy(); cbest = min(cbest, time.perf_counter() - t)\n"
        "if MPI.COMM_WORLD.Get_rank() == 0: print('INTRA', 2 * 4 * h / best, 4 * n / cbest, flush=True)\n")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    try:
        res = slownet.run("bridge", 2, [sys.executable, f.name], "1gbit", timeout=timeout, capture=True, per_node=2)
    finally:
        os.unlink(f.name)
    for line in (res.stdout or "").splitlines():
        if line.startswith("INTRA "):
            return float(line.split()[1]), float(line.split()[2])
    raise RuntimeError(f"the intra-node measurement printed no figure (rc {res.returncode}): {res.stderr[-2000:]}")


def run_nodes_check(args: argparse.Namespace, inputs: Inputs) -> List[dict]:
    """``bench exchange`` at each layout of ``--layouts`` on the bridge harness at ``--check-rate``
    (the CHECK_METHODS configs and ``local``), each row against :func:`predict_harness`."""
    intra, copy = measure_intra(inputs.numel, args.timeout)
    if args.check_intra_gbyte:
        intra = args.check_intra_gbyte * 1e9
    out = []
    for nodes, per_node in args.layouts:
        ns = exchange_args(np=nodes * per_node, net="bridge", per_node=per_node, rates=args.check_rate,
                           shapes="resnet50", steps=args.steps, warmup=1, timeout=args.timeout)
        rows = eb.launch(ns, ["local"] + list(CHECK_METHODS), [args.check_rate])
        local = [r["ms_per_step"] for r in rows if r["config"] == "local"]
        if not local:
            raise RuntimeError(f"the {nodes} x {per_node} run measured no compute-only (local) step")
        out += compare_nodes(rows, local[0], nodes, per_node, inputs, intra, args.cores, args.alpha_us * 1e-6, copy)
    return out


def compare_nodes(rows: Sequence[dict], local_ms: float, nodes: int, per_node: int, inputs: Inputs,
                  intra_bytes_per_s: float, cores: float, alpha_s: float, copy_bytes_per_s: float = 0.0
                  ) -> List[dict]:
    """Each CHECK_METHODS row's measured exchange (step minus ``local_ms``) against its prediction."""
    out = []
    for r in rows:
        method = CHECK_METHODS.get(r["config"])
        if method is None or "skipped" in r or not r.get("rate_bits_per_s"):
            continue
        p = predict_harness(method, nodes, per_node, inputs, rate_bits_per_s=r["rate_bits_per_s"],
                            intra_bytes_per_s=intra_bytes_per_s, cores=cores, alpha_s=alpha_s,
                            copy_bytes_per_s=copy_bytes_per_s)
        measured = r["ms_per_step"] - local_ms
        out.append({"layout": f"{nodes}x{per_node}", "method": method, "rate": r["rate"],
                    "measured_ms": round(measured, 1), "predicted_ms": round(p["exchange_ms"], 1),
                    "codec_ms": round(p["codec_ms"], 1), "framework_ms": round(p["framework_ms"], 1),
                    "copy_ms": round(p["copy_ms"], 1), "intra_ms": round(p["intra_ms"], 1),
                    "link_ms": round(p["link_ms"], 1), "intra_gbyte": round(intra_bytes_per_s / 1e9, 3),
                    "copy_gbyte": round(copy_bytes_per_s / 1e9, 3),
                    "rel_error": round((p["exchange_ms"] - measured) / measured, 3) if measured > 0 else None})
    return out


def format_nodes_check(results: Sequence[dict]) -> str:
    """Markdown table of :func:`compare_nodes`'s rows."""
    lines = ["| layout | method | measured exchange ms | PREDICTED ms (codec + framework + node copies + intra + link) "
             "| error |", "|---|---|---|---|---|"]
    for c in results:
        err = "n/a" if c["rel_error"] is None else f"{100 * c['rel_error']:+.0f}%"
        lines.append(f"| {c['layout']} | {c['method']} | {c['measured_ms']:.1f} | {c['predicted_ms']:.1f} "
                     f"({c['codec_ms']:.0f} + {c['framework_ms']:.0f} + {c['copy_ms']:.0f} + {c['intra_ms']:.0f} + "
                     f"{c['link_ms']:.0f}) | {err} |")
    return "\n".join(lines)


def parse_layouts(text: str) -> List[Tuple[int, int]]:
    """``"2x1,1x2,2x2"`` -> [(2, 1), (1, 2), (2, 2)]; a clear error for anything else."""
    out = []
    for piece in (p.strip() for p in text.split(",") if p.strip()):
        try:
            n, l = (int(v) for v in piece.lower().split("x"))
        except ValueError:
            raise argparse.ArgumentTypeError(f"a layout is NxL (nodes x ranks per node), got {piece!r}") from None
        if n < 1 or l < 1:
            raise argparse.ArgumentTypeError(f"a layout needs N, L >= 1, got {piece!r}")
        out.append((n, l))
    return out


__all__ = ["CHECK_METHODS", "LAYOUTS", "compare_nodes", "format_nodes_check", "measure_intra", "parse_layouts",
           "framework_ms", "predict_harness", "run_nodes_check", "NODE_COPY_PASSES"]
