"""``bench model --check-scaling``: how well the cluster form's size scaling predicts codec times.

The cluster form (:mod:`.cost_cluster`) takes every codec time and payload size as linear in the
number of values, measured on one model and scaled to the user's. This check measures the
inputs here (:func:`~horovod_gradcomp.bench.cost_calibrate.calibrate`) on the first ``t``
tensors of ResNet-50, scales them to the whole of ResNet-50, and compares with the inputs
measured on the whole: the relative error of each term.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

from .cost_calibrate import calibrate
from .cost_cluster import scale_inputs
from .cost_model import Inputs

TERMS = ("encode_ms", "decode_ms", "dmean8_ms", "bytes")


def check_scaling(tensor_counts: Sequence[int] = (60, 120), repeat: int = 3) -> Tuple[Inputs, List[dict]]:
    """(the whole's inputs, rows): one row per (first ``t`` tensors, codec or ``fp16``, term):
    ``scaled`` (the part's figure scaled to the whole), ``measured`` (the whole's), ``rel_error``."""
    whole = calibrate(repeat)
    rows = []
    for t in tensor_counts:
        part = calibrate(repeat, limit_tensors=t)
        up = scale_inputs(part, whole.numel)
        pairs = [(key, term, up.codecs[key][term], whole.codecs[key][term]) for key in whole.codecs for term in TERMS]
        pairs += [("fp16", term, up.fp16[term], whole.fp16[term]) for term in ("encode_ms", "decode_ms")]
        rows += [{"tensors": t, "values": part.numel, "method": key, "term": term, "scaled": a, "measured": b,
                  "rel_error": (a - b) / b if b else None} for key, term, a, b in pairs]
    return whole, rows


def format_scaling(rows: Sequence[dict], whole_numel: int) -> str:
    """Markdown table of :func:`check_scaling`'s rows."""
    out = [f"Scaled to ResNet-50's {whole_numel:,} values from its first tensors, against the whole measured:", "",
           "| first tensors (values) | method | term | scaled | measured | error |", "|---|---|---|---|---|---|"]
    for r in rows:
        err = f"{100 * r['rel_error']:+.0f}%" if r["rel_error"] is not None else "-"
        out.append(f"| {r['tensors']} ({r['values']:,}) | {r['method']} | {r['term']} | {r['scaled']:,.1f} | "
                   f"{r['measured']:,.1f} | {err} |")
    return "\n".join(out)
