"""``bench exchange --breakdown``: per rank and per step, where a Horovod step's time goes.

Each timed step of a config is recorded on a :class:`~horovod_gradcomp.exchange.timeline.Timeline`
(:func:`instrument`, :func:`recorded_step`): the step is ``zero_grad``, ``backward`` (autograd
and Horovod's hooks, with ``compress`` inside), ``synchronize`` (Horovod waits for its
allreduces: the codecs' one-element placeholders, or the dense gradients of ``none``/``fp16``,
and calls ``decompress``; the first ``decompress`` of a codec step runs the engine's flush:
preamble, encode, collectives, decode) and the optimizer's update (``step()`` under
``skip_synchronize()``: the same work as a plain ``step()``). :func:`step_phases` turns one
step's intervals into exclusive milliseconds per phase (:data:`PHASES`), which add up to the
step on the main thread; the communication thread (``overlap`` with buckets) is reported beside it.

Output (:func:`write_breakdown`): ``PREFIX.json`` (every config, rank and step) and ``PREFIX.png``
(one stacked bar per config and rank: mean ms per phase over the timed steps).
"""
from __future__ import annotations

import json
import statistics
from typing import Dict, List, Optional, Sequence

from ..exchange.timeline import Timeline, attach, exclusive_times, split_steps
from .timing import LR, timed_steps

MAIN = "MainThread"
#: Phase keys of :func:`~horovod_gradcomp.exchange.timeline.exclusive_times` -> what they are.
PHASES = {
    "zero_grad": "zero_grad",
    "backward": "backward: autograd + Horovod hooks and enqueue",
    "hooks": "compress() in the hooks",
    "synchronize": "waiting on Horovod (placeholder round trip / dense allreduce)",
    "flush": "engine flush: bookkeeping (with a communication thread: waiting for it)",
    "nonfinite": "non-finite check: one read of every gradient before the preamble (DGC without clipping)",
    "measure": "encode's first pass before the preamble (scales; the non-finite check)",
    "preamble": "preamble: digest + flag",
    "preamble/collective": "preamble allgather: waiting for other ranks",
    "node_scatter": "hierarchical: the node scatter's send buffer (stripes copied in)",
    "node_scatter/collective": "hierarchical: the node scatter's alltoallv (inside the node)",
    "node_sum": "hierarchical: summing the node's stripes (fp32)",
    "encode": "encode + error feedback",
    "encode/collective": "scale allreduce",
    "exchange": "packing / framing",
    "exchange/collective": "data collectives (wire)",
    "wait": "pipelined chunks: waiting for the wire thread's allgather",
    "wire": "wire thread: framing around its collectives",
    "wire/collective": "wire thread: pipelined chunks' allgathers (wire)",
    "decode": "decode mean",
    "node_gather": "hierarchical: the node gather's part and the write-back into the gradients",
    "node_gather/collective": "hierarchical: the node gather's allgatherv (inside the node)",
    "decompress": "decompress()",
    "optimizer": "optimizer update",
    "step": "untracked (between phases)",
}
COLORS = {
    "zero_grad": "#c7c7c7", "backward": "#7f7f7f", "hooks": "#bcbd22", "synchronize": "#d62728",
    "flush": "#c5b0d5", "nonfinite": "#ad494a", "measure": "#393b79", "preamble": "#ff9896", "preamble/collective": "#ff7f0e", "encode": "#1f77b4",
    "encode/collective": "#aec7e8", "exchange": "#9467bd", "exchange/collective": "#2ca02c",
    "node_scatter": "#fdd0a2", "node_scatter/collective": "#fd8d3c", "node_sum": "#e6550d",
    "node_gather": "#c6dbef", "node_gather/collective": "#6baed6",
    "wait": "#dbdb8d", "wire": "#e377c2", "wire/collective": "#2ca02c", "decode": "#17becf",
    "decompress": "#8c564b", "optimizer": "#98df8a", "step": "#f7b6d2",
}


def time_local(cfg, shapes, grads, steps: int, warmup: int, inject) -> dict:
    """The ``local`` row: the bench's step with a plain SGD and no communication at all
    (``zero_grad``, the injected backward, ``step``): the compute-only step of the floor."""
    import torch
    if cfg.options:
        raise ValueError(f"local takes no options, got {cfg.options}")
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    opt = torch.optim.SGD(params, lr=LR, momentum=0.0)

    def step():
        opt.zero_grad()
        inject.apply(grads, *params).backward()
        opt.step()
    for _ in range(warmup):
        step()
    return dict(timed_steps(step, steps), factory="torch.optim.SGD (no communication)", bytes_sent=0.0,
                bytes_dense=0.0)


def floors(rows: Sequence[dict]) -> List[dict]:
    """Per codec row with a breakdown, the issue's floor from the same run:
    ``max(local step + codec time, link time)``, codec time being the slowest rank's mean
    encode (its first pass, ``measure``, included) + decode; and the row's ``ms_per_step`` over it."""
    local = next((r["ms_per_step"] for r in rows if r.get("config") == "local" and "ms_per_step" in r), None)
    out = []
    for s in summarize(rows):
        ranks = s["ranks"]
        codec = max(sum(r["mean_ms"].get(k, 0.0) for k in ("measure", "encode", "decode")) for r in ranks)
        if local is None or codec == 0.0:
            continue
        row = next(r for r in rows if r.get("config") == s["config"])
        floor = max(local + codec, row.get("link_ms") or 0.0)
        out.append({"config": s["config"], "k": s["k"], "rate": s["rate"], "local_ms": local,
                    "codec_ms": round(codec, 3), "link_ms": row.get("link_ms"), "floor_ms": round(floor, 3),
                    "ms_per_step": s["ms_per_step"], "vs_floor": round(s["ms_per_step"] / floor, 3)})
    return out


def format_floors(items: Sequence[dict]) -> str:
    lines = ["config  K  rate  local_ms + codec_ms | link_ms -> floor_ms  ms/step  vs floor"]
    lines += [f"{f['config']}  {f['k']}  {f['rate'] or '-'}  {f['local_ms']:.1f} + {f['codec_ms']:.1f} | "
              f"{f['link_ms'] if f['link_ms'] is not None else '-'} -> {f['floor_ms']:.1f}  {f['ms_per_step']:.1f}  "
              f"{f['vs_floor']:.2f}x" for f in items]
    return "\n".join(lines)


def instrument(compression, timeline: Timeline) -> None:
    """Record ``compression``'s calls from Horovod (``compress`` as ``hooks``, ``decompress``)
    and, for a codec, its engine's flush, timed blocks and collectives on ``timeline``."""
    compression.compress = timeline.wrap("hooks", compression.compress)
    compression.decompress = timeline.wrap("decompress", compression.decompress)
    engine = getattr(compression, "engine", None)
    if engine is not None:
        attach(engine, timeline)


def recorded_step(opt, timeline: Timeline, backward) -> None:
    """One optimizer step (``zero_grad``, ``backward()``, ``step``) with each part on ``timeline``."""
    with timeline.span("step"):
        with timeline.span("zero_grad"):
            opt.zero_grad()
        with timeline.span("backward"):
            backward()
        with timeline.span("synchronize"):
            opt.synchronize()
        with timeline.span("optimizer"):
            with opt.skip_synchronize():
                opt.step()


def step_phases(timeline: Timeline) -> List[dict]:
    """Take the timeline's intervals; per recorded step: ``step_ms`` (the step span),
    ``main`` (phase -> exclusive ms on the main thread, adding up to ``step_ms``) and
    ``threads`` (other threads' phases, e.g. ``hgc-exchange``)."""
    out = []
    for ivs in split_steps(timeline.take()):
        step = next(iv for iv in ivs if iv.phase == "step" and iv.thread == MAIN)
        per_thread = exclusive_times(ivs)
        main = {k: round(1e3 * v, 4) for k, v in per_thread.pop(MAIN, {}).items()}
        others = {t: {k: round(1e3 * v, 4) for k, v in d.items()} for t, d in per_thread.items()}
        out.append({"step_ms": round(1e3 * (step.t1 - step.t0), 4), "main": main, "threads": others})
    return out


def mean_phases(steps: Sequence[dict], part: str = "main") -> Dict[str, float]:
    """Phase -> mean ms over ``steps`` (a phase absent from a step counts 0 there)."""
    keys = dict.fromkeys(k for s in steps for k in s[part])
    return {k: statistics.fmean(s[part].get(k, 0.0) for s in steps) for k in keys}


def summarize(rows: Sequence[dict]) -> List[dict]:
    """The breakdown of every measured row: config, K, net, rate, and per rank the steps and
    the mean ms per phase (main thread), the mean step and the communication thread's means."""
    out = []
    for row in rows:
        if "breakdown" not in row:
            continue
        ranks = []
        for rank, steps in enumerate(row["breakdown"]):
            threads = sorted({t for s in steps for t in s["threads"]})
            ranks.append({"rank": rank, "mean_step_ms": round(statistics.fmean(s["step_ms"] for s in steps), 3),
                          "mean_ms": {k: round(v, 3) for k, v in mean_phases(steps).items()},
                          "threads_mean_ms": {t: {k: round(statistics.fmean(s["threads"].get(t, {}).get(k, 0.0)
                                                                            for s in steps), 3)
                                                  for k in dict.fromkeys(k for s in steps
                                                                         for k in s["threads"].get(t, {}))}
                                              for t in threads},
                          "steps": steps})
        out.append({k: row.get(k) for k in ("config", "k", "net", "rate", "numel", "ms_per_step")} | {"ranks": ranks})
    return out


def format_breakdown(summary: Sequence[dict]) -> str:
    """A table: one line per config and rank, mean ms per phase (main thread)."""
    keys = [k for k in PHASES if any(k in r["mean_ms"] for s in summary for r in s["ranks"])]
    head = ["config", "rank", "step"] + keys
    lines = ["  ".join(head)]
    for s in summary:
        for r in s["ranks"]:
            cells = [s["config"], str(r["rank"]), f"{r['mean_step_ms']:.1f}"]
            cells += [f"{r['mean_ms'].get(k, 0.0):.1f}" for k in keys]
            lines.append("  ".join(cells))
    return "\n".join(lines)


def write_breakdown(rows: Sequence[dict], prefix: str, note: Optional[str] = None) -> List[dict]:
    """Write ``PREFIX.json`` and ``PREFIX.png`` from the rows that carry a breakdown; return the summary."""
    summary = summarize(rows)
    with open(prefix + ".json", "w") as f:
        json.dump({"phases": PHASES, "note": note, "floors": floors(rows), "configs": summary}, f, indent=1)
    if summary:
        plot(summary, prefix + ".png", note)
    return summary


def plot(summary: Sequence[dict], path: str, note: Optional[str] = None) -> None:
    """One horizontal stacked bar per config and rank (mean ms per phase), to ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    bars = [(f"{s['config']} r{r['rank']}", r["mean_ms"]) for s in summary for r in s["ranks"]]
    keys = [k for k in PHASES if any(k in m for _, m in bars)]
    fig, ax = plt.subplots(figsize=(11, 0.35 * len(bars) + 2.2))
    for i, (_, means) in enumerate(bars):
        left = 0.0
        for k in keys:
            v = max(means.get(k, 0.0), 0.0)
            ax.barh(i, v, left=left, color=COLORS.get(k), label=PHASES[k] if i == 0 else None)
            left += v
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per step (mean over timed steps, main thread)")
    s0 = summary[0]
    ax.set_title(f"Step breakdown, K={s0['k']}, {s0['net']} {s0['rate'] or 'unlimited'}"
                 + (f"\n{note}" if note else ""), fontsize=9)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


__all__ = ["PHASES", "floors", "format_floors", "time_local", "instrument", "recorded_step", "step_phases", "summarize", "write_breakdown",
           "format_breakdown", "mean_phases"]
