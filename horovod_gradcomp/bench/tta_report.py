"""What ``bench tta`` makes of its rows: the target, each row's time to it, the table and the plots.

For each (rate, optimizer), the target is the final held-out loss of :data:`REFERENCE`
(Horovod's dense fp32 allreduce) times ``1 + TARGET_MARGIN`` (2%); a row's
``time_to_target_s`` is the training seconds at its first evaluation whose loss is at or below
the target (None when it never gets there), ``steps_to_target`` the step of that evaluation,
and ``speedup`` the reference's time to target over the row's.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from .tta_rows import REFERENCE, row_label

TARGET_MARGIN = 0.02


def first_at_or_below(points: Sequence[dict], target: float) -> Optional[dict]:
    """The first point whose ``loss`` is at or below ``target`` (None if none is)."""
    return next((p for p in points if math.isfinite(p["loss"]) and p["loss"] <= target), None)


def add_targets(rows: List[dict]) -> List[dict]:
    """Give every row ``target_loss``, ``time_to_target_s``, ``steps_to_target`` and ``speedup``
    (in place; also returned). ValueError when a (rate, optimizer) has no :data:`REFERENCE` row."""
    refs: Dict[Tuple[str, str], dict] = {(r["rate"], r["optimizer"]): r for r in rows if r["row"] == REFERENCE}
    for r in rows:
        ref = refs.get((r["rate"], r["optimizer"]))
        if ref is None:
            raise ValueError(f"no {REFERENCE} row at {r['rate']} with {r['optimizer']}: it sets the target")
        target = ref["final_loss"] * (1 + TARGET_MARGIN)
        hit = first_at_or_below(r["points"], target)
        r["target_loss"] = target
        r["time_to_target_s"] = hit["seconds"] if hit else None
        r["steps_to_target"] = hit["step"] if hit else None
    for r in rows:
        ref_t = refs[(r["rate"], r["optimizer"])]["time_to_target_s"]
        t = r["time_to_target_s"]
        r["speedup"] = ref_t / t if (t and ref_t is not None) else None
    return rows


def _cell(r: Optional[dict]) -> List[str]:
    if r is None:
        return ["-", "-", "-"]
    t = r["time_to_target_s"]
    return [f"{t:.1f}" if t is not None else "not reached", f"{r['speedup']:.2f}x" if r["speedup"] else "-",
            f"{r['final_loss']:.3f}"]


def table(rows: Sequence[dict]) -> str:
    """Markdown: per optimizer, a line per row with, at each rate, the seconds to the target,
    the speed-up against Horovod fp32 and the final loss."""
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    out = []
    for opt in dict.fromkeys(r["optimizer"] for r in rows):
        mine = [r for r in rows if r["optimizer"] == opt]
        target = {r["rate"]: r["target_loss"] for r in mine}
        targets = ", ".join(f"{rate}: {target[rate]:.3f}" for rate in rates if rate in target)
        out += [f"### {opt}: seconds to the target loss (Horovod fp32's final loss + {100 * TARGET_MARGIN:g}%: "
                f"{targets})", "",
                "| row | " + " | ".join(f"{r}: s to target | {r}: speed-up | {r}: final loss" for r in rates)
                + " |", "|---|" + "---|---|---|" * len(rates)]
        for name in dict.fromkeys(r["row"] for r in mine):
            cells = []
            for rate in rates:
                cells += _cell(next((r for r in mine if r["row"] == name and r["rate"] == rate), None))
            out.append(f"| {row_label(name)} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def plot(rows: Sequence[dict], path: str, title: str) -> None:
    """One PNG of one rate's rows: per optimizer, held-out loss against training seconds (log
    axis) and against steps, one line per row, the target dotted."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    opts = list(dict.fromkeys(r["optimizer"] for r in rows))
    fig, axes = plt.subplots(len(opts), 2, figsize=(13, 4.5 * len(opts)), squeeze=False)
    for i, opt in enumerate(opts):
        mine = [r for r in rows if r["optimizer"] == opt]
        for r in mine:
            pts = [p for p in r["points"] if p["step"] > 0]
            style = dict(lw=2.2, color="black") if r["row"] == REFERENCE else dict(lw=1.2)
            axes[i][0].plot([p["seconds"] for p in pts], [p["loss"] for p in pts], label=row_label(r["row"]), **style)
            axes[i][1].plot([p["step"] for p in r["points"]], [p["loss"] for p in r["points"]], **style)
        for ax, xlabel in ((axes[i][0], "training seconds (log)"), (axes[i][1], "step")):
            ax.axhline(mine[0]["target_loss"], ls=":", color="grey")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"held-out loss, nats/char ({opt})")
            ax.grid(alpha=0.3)
        axes[i][0].set_xscale("log")
        axes[i][0].legend(fontsize=7, ncol=2)
    import textwrap
    fig.suptitle("\n".join(textwrap.wrap(title, 150)), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


#: The lines between which ``bench tta --readme`` writes its table in a Markdown page.
README_BEGIN = "<!-- bench tta --readme: generated from the JSON, do not edit by hand -->"
README_END = "<!-- end of bench tta --readme -->"


def _short(r: Optional[dict]) -> str:
    """One cell: seconds to the target and the speed-up, "not reached" (with the final loss), or "-"."""
    if r is None:
        return "-"
    if r["time_to_target_s"] is None:
        return f"not reached ({r['final_loss']:.2f})"
    return f"{r['time_to_target_s']:.0f} s ({r['speedup']:.2f}x)"


def compact_table(rows: Sequence[dict]) -> str:
    """Markdown, one line per row and one column per (optimizer, rate): the seconds to the
    target and the speed-up against Horovod fp32, or "not reached" with the final loss; a last
    line gives each column's target loss. Rows need :func:`add_targets` first."""
    keys = list(dict.fromkeys((r["optimizer"], r["rate"]) for r in rows))
    head = "| row | " + " | ".join(f"{opt}, {rate}" for opt, rate in keys) + " |"
    out = [head, "|---|" + "---:|" * len(keys)]
    for name in dict.fromkeys(r["row"] for r in rows):
        cells = [_short(next((r for r in rows if r["row"] == name and (r["optimizer"], r["rate"]) == k), None))
                 for k in keys]
        out.append(f"| {row_label(name)} | " + " | ".join(cells) + " |")
    targets = [next(r["target_loss"] for r in rows if (r["optimizer"], r["rate"]) == k) for k in keys]
    out.append("| *target loss* | " + " | ".join(f"*{t:.3f}*" for t in targets) + " |")
    return "\n".join(out) + "\n"


def replace_block(page: str, block: str) -> str:
    """``page`` with the text between :data:`README_BEGIN` and :data:`README_END` replaced by
    ``block``; ValueError when the page lacks either marker line or has them out of order."""
    lines = page.splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.strip() in (README_BEGIN, README_END)]
    if len(marks) != 2 or lines[marks[0]].strip() != README_BEGIN:
        raise ValueError(f"the page needs one line {README_BEGIN!r} and, after it, one line {README_END!r}")
    body = block if block.endswith("\n") else block + "\n"
    return "".join(lines[:marks[0] + 1]) + body + "".join(lines[marks[1]:])
