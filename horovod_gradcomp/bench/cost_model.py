"""``python -m horovod_gradcomp.bench model``: a cost model of one step, and where each method wins.

PREDICTED figures, from measured inputs. One step at the defaults (one bucket, exchanged at
``synchronize()``: no overlap of communication with compute) on K ranks is

    step = cpu * (compute + codec(K)) + wire(K) + messages(K) * alpha

* ``compute``: the step without communication (measured: ``bench exchange --np 1 --configs none``);
* ``codec(K)``: encode and decode on one core (measured: ``bench codecs``, native impl, the
  whole model, and the decode-mean of 1 and of 8 payloads, :func:`decode_mean_ms`, from which
  ``dmean(K)`` is interpolated linearly): allgather ``encode + dmean(K)`` (each rank decodes
  the mean of K payloads); two-phase ``(1 + 1/K) * encode + dmean(K) / K + decode`` (its
  stripes: the owner's decode-mean of K stripes of 1/K, a requantization of 1/K, the decode
  of every stripe); fp16
  ``encode + decode`` (the casts); fp32 nothing; PowerSGD rank r: its matrix products,
  orthogonalization and error feedback (measured here on the same shapes: :func:`powersgd_compute_ms`);
* ``wire(K)``: bytes per rank over the link rate: allgather ``(K-1) S``; two-phase
  ``2 (K-1)/K S`` (TernGrad, whose owners send exact sums of w = 4, 8 or 16 bits:
  ``(K-1)/K (1 + w/2) S``, and its codec time ``encode + dmean(K)/K + decode``); ring
  allreduce fp32/fp16 ``2 (K-1)/K`` of the dense bytes; PowerSGD the ring allreduce of its P
  and Q factors and of the tensors it leaves uncompressed. On the ``loopback`` harness all K
  ranks' bytes share one link (``--layout loopback``);
* ``messages(K) * alpha``: the latency of every collective (ring: K-1 messages per
  allgather, 2(K-1) per allreduce; the codecs' preamble and Horovod's placeholder allreduce:
  ``ceil(log2 K)`` each);
* ``cpu``: ``max(1, K / cores)`` when K ranks share ``cores`` cores (the harness), else 1.

Pipelined chunks (the default for fixed-size codecs, ``pipeline_bytes``): a bucket of ``N``
chunks encodes chunk i+1 and decodes chunk i-1 while chunk i is on the wire, so the codec and
the wire overlap: ``cpu * codec(K) + wire(K)`` becomes ``max(cpu * codec(K), wire(K)) +
min(cpu * codec(K), wire(K)) / N`` (``N``: the payload over the chunk size, at most 8).

Two refinements when the inputs have them (``--measure`` records both):

* in situ (codecs and PowerSGD): ``compute + codec(2)`` is replaced by the measured step of
  the method itself at -np 2 without a rate limit (``bench exchange --np 2 --net none``: the
  hooks, Horovod's placeholder round trip and background thread, the preamble's non-finite
  check, the encode, the decode-mean of 2 payloads, the optimizer, two ranks sharing the
  machine; at -np 1 Horovod calls no hooks, so the codecs would not run), and
  ``codec(K) - codec(2)`` is added from the isolated figures above;
* in-situ CPU time: with ``cores``, an in-situ step is at least ``cpu(2) * K / cores``, where
  ``cpu(2)`` is the CPU time one rank used per step there (all its threads): K ranks on fewer
  cores need that much CPU between them, while the time a rank spent waiting in the measured
  step overlaps the others' work (scaling the whole step by ``K / cores`` counted the waiting
  twice);
* contention: ranks that run at once on one machine share its memory bandwidth; the factor
  (the codec step timed in ``min(K, cores)`` processes at once over the same step alone) scales
  the CPU term on the harness. A cluster with one rank per machine has none (the tables).

``--check`` compares the model with ``bench exchange`` on the loopback harness at -np 2 and 4
(1 Gbit/s) and prints the relative error per config: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from ..codecs.ternary_sum import level_width
from ..exchange.pipeline import DEFAULT_CHUNK_BYTES, MAX_CHUNKS

COMMAND = "model"
HELP = "PREDICTED step time per method, pattern, K and link rate, from measured inputs (--check: against the harness)"

CODECS = {"onebit": ("onebit", {}), "terngrad": ("terngrad", {}), "qsgd4": ("qsgd", {"bits": 4}),
          "dgc": ("dgc", {"density": 0.001})}
VARIABLE = {"dgc"}            # allgather only
#: Codecs whose two-phase owners send the exact sum (codecs/ternary_sum.py): owner payloads of
#: ``level_width(K) / 2`` times the codec's own (2-bit) payload, no requantization.
EXACT_SUM = {"terngrad"}
POWERSGD_RANKS = (1, 4)
KS = (8, 16, 32, 64, 128, 256)
RATES_GBIT = (1, 10, 25, 100)
#: PyTorch's PowerSGD hook compresses a matrix only when (n + m) r * this < n m.
MIN_COMPRESSION_RATE = 2.0


@dataclass
class Inputs:
    """What the model is computed from (every figure measured; see :func:`measure_inputs`)."""
    numel: int
    compute_ms: float                     # the step without communication, one rank
    codecs: Dict[str, dict]               # key -> {"encode_ms", "decode_ms", "bytes"} (whole model, one core)
    fp16: dict                            # {"encode_ms", "decode_ms"}: the casts
    powersgd: Dict[int, dict]             # rank -> {"compute_ms", "bytes"} (fp32 bytes allreduced)
    source: str = ""
    in_situ: Dict[str, float] = field(default_factory=dict)   # method -> ms per step at -np IN_SITU_NP
    contention: Dict[int, float] = field(default_factory=dict)  # ranks at once -> slowdown (1 for one)
    in_situ_cpu: Dict[str, float] = field(default_factory=dict)  # method -> CPU ms one rank took per step there

    def to_json(self) -> dict:
        return {"numel": self.numel, "compute_ms": self.compute_ms, "codecs": self.codecs, "fp16": self.fp16,
                "powersgd": {str(r): v for r, v in self.powersgd.items()}, "source": self.source,
                "in_situ": self.in_situ, "contention": {str(p): f for p, f in self.contention.items()},
                "in_situ_cpu": self.in_situ_cpu}

    @classmethod
    def from_json(cls, d: dict) -> "Inputs":
        return cls(d["numel"], d["compute_ms"], d["codecs"], d["fp16"], {int(r): v for r, v in d["powersgd"].items()},
                   d.get("source", ""), dict(d.get("in_situ", {})),
                   {int(p): float(f) for p, f in d.get("contention", {}).items()}, dict(d.get("in_situ_cpu", {})))

    def contention_at(self, ranks: int) -> float:
        """The slowdown of ``ranks`` ranks computing at once on one machine (1 without a figure)."""
        known = [p for p in self.contention if p <= ranks]
        return self.contention[max(known)] if known else 1.0


def methods() -> List[str]:
    """Every (method, pattern) the model prices, as labels."""
    out = ["fp32", "fp16"]
    for key in CODECS:
        out.append(f"{key}/allgather")
        if key not in VARIABLE:
            out.append(f"{key}/two_phase")
    return out + [f"powersgd{r}" for r in POWERSGD_RANKS]


def predict(method: str, k: int, bits_per_s: float, inputs: Inputs, *, alpha_s: float = 25e-6,
            layout: str = "switch", cores: Optional[float] = None,
            pipeline_bytes: Optional[int] = DEFAULT_CHUNK_BYTES) -> dict:
    """Predicted ms of one step of ``method`` (a :func:`methods` label) on ``k`` ranks:
    ``step_ms`` and its terms (``cpu_ms``, ``wire_ms``, ``latency_ms``, ``bytes_per_rank``,
    ``chunks``: pipelined chunks, 1 without). ``layout``: ``switch`` (a full-duplex link per
    rank) or ``loopback`` (one link for all). ``pipeline_bytes``: the factories' option (None:
    no pipelined chunks)."""
    if k < 1:
        raise ValueError(f"K must be >= 1, got {k}")
    n = inputs.numel
    log_k = math.ceil(math.log2(k)) if k > 1 else 0
    ring = 2.0 * (k - 1) / k
    codec_ms, codec_ref_ms, messages, chunks = 0.0, 0.0, 0, 1
    if method == "fp32":
        sent, messages = ring * 4 * n, 2 * (k - 1)
    elif method == "fp16":
        sent, messages = ring * 2 * n, 2 * (k - 1)
        codec_ms = codec_ref_ms = inputs.fp16["encode_ms"] + inputs.fp16["decode_ms"]
    elif method.startswith("powersgd"):
        p = inputs.powersgd[int(method[len("powersgd"):])]
        sent, messages = ring * p["bytes"], 3 * 2 * (k - 1)     # uncompressed tensors, P, Q: three allreduces
        codec_ms = codec_ref_ms = p["compute_ms"]
    else:
        key, pattern = method.split("/")
        c = inputs.codecs[key]
        messages = 2 * log_k                                   # Horovod's placeholder allreduce, the preamble
        if pipeline_bytes and key not in VARIABLE and k > 1:
            chunks = max(1, min(MAX_CHUNKS, int(c["bytes"] // pipeline_bytes)))
        if pattern == "allgather":
            sent = (k - 1) * c["bytes"]
            messages += (k - 1) * (2 if key in VARIABLE else chunks)  # variable size: sizes first
            codec_ms, codec_ref_ms = c["encode_ms"] + dmean(c, k), c["encode_ms"] + dmean(c, IN_SITU_NP)
        elif pattern == "two_phase":
            if key in VARIABLE:
                raise ValueError(f"{key} has variable-size payloads: allgather only")
            messages += 2 * (k - 1) * chunks
            if key in EXACT_SUM:  # owners add the K payloads as integers and send the sums
                sent = (k - 1) / k * c["bytes"] * (1 + level_width(k) / 2)
                codec_ms = c["encode_ms"] + dmean(c, k) / k + c["decode_ms"]
                codec_ref_ms = c["encode_ms"] + dmean(c, IN_SITU_NP) / IN_SITU_NP + c["decode_ms"]
            else:
                sent = ring * c["bytes"]
                codec_ms = (1 + 1 / k) * c["encode_ms"] + dmean(c, k) / k + c["decode_ms"]
                m = IN_SITU_NP
                codec_ref_ms = (1 + 1 / m) * c["encode_ms"] + dmean(c, m) / m + c["decode_ms"]
        else:
            raise ValueError(f"unknown pattern {pattern!r}")
    cpu = max(1.0, k / cores) if cores else 1.0
    if cores and method not in inputs.in_situ:  # ranks of one machine share its memory bandwidth
        cpu *= inputs.contention_at(min(k, int(cores)))  # (an in-situ step was measured sharing it)
    on_link = sent * (k if layout == "loopback" else 1)
    wire_ms = 1e3 * 8 * on_link / bits_per_s if k > 1 else 0.0
    latency_ms = 1e3 * messages * alpha_s
    if method in inputs.in_situ:  # the method's own step at K = IN_SITU_NP, plus what K adds
        base = inputs.in_situ[method]
        if cores and method in inputs.in_situ_cpu:
            # K ranks on `cores` cores: a step lasts at least the CPU time all of them need over
            # the cores (waiting in the measured step overlaps other ranks' work; CPU time does not)
            base = max(base, inputs.in_situ_cpu[method] * k / cores)
            cpu_ms = base + cpu * (codec_ms - codec_ref_ms)
        else:
            cpu_ms = cpu * (base + codec_ms - codec_ref_ms)
    else:
        cpu_ms = cpu * (inputs.compute_ms + codec_ms)
    step_ms = cpu_ms + wire_ms + latency_ms
    if chunks > 1:  # the codec's share of the CPU term overlaps the wire
        overlapped = min(cpu * codec_ms, wire_ms)
        step_ms -= overlapped * (1 - 1 / chunks)
    return {"method": method, "k": k, "rate_bits_per_s": bits_per_s, "step_ms": step_ms,
            "cpu_ms": cpu_ms, "wire_ms": wire_ms, "latency_ms": latency_ms, "bytes_per_rank": sent,
            "chunks": chunks}


def dmean(c: dict, k: int) -> float:
    """ms of the decode-mean of ``k`` payloads of the whole model: linear through the measured
    1- and 8-payload figures when the inputs have them, else ``k`` single decodes."""
    if "dmean1_ms" in c and "dmean8_ms" in c:
        return c["dmean1_ms"] + (k - 1) * (c["dmean8_ms"] - c["dmean1_ms"]) / 7
    return k * c["decode_ms"]


# -- inputs ---------------------------------------------------------------------------

def decode_mean_ms(name: str, options: dict, k: int, repeat: int = 3) -> float:
    """Median ms of decoding the mean of ``k`` copies of each ResNet-50 gradient's payload into
    its output (``decode_mean_stacked`` from a [k, n] receive buffer, or ``decode_mean_list`` for
    variable-size codecs), summed over the tensors: what a rank does per step at K = k."""
    import torch
    from .. import get_codec
    from .codecs_bench import make_gradients
    from .shapes import resnet50_shapes
    from ..codecs.base import Payload
    codec = get_codec(name, impl="native", **options)
    grads = make_gradients(resnet50_shapes())
    jobs = []
    for i, g in enumerate(grads):
        getattr(codec, "reset_stream", lambda p: None)(i)
        p = codec.encode(g)
        if getattr(codec, "variable_size", False):
            jobs.append((None, [p] * k, torch.empty_like(g)))
        else:
            stacked = Payload({b: t.reshape(1, -1).expand(k, -1).contiguous() for b, t in p.buffers.items()},
                              p.shape, p.dtype, p.device)
            jobs.append((stacked, None, torch.empty_like(g)))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for stacked, plist, out in jobs:
            if stacked is not None:
                codec.decode_mean_stacked(stacked, out=out)
            else:
                codec.decode_mean_list(plist, out=out)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def powersgd_factor_bytes(shapes, rank: int) -> int:
    """fp32 bytes PyTorch's PowerSGD hook allreduces per step at ``rank``: P (n r) and Q (m r) of
    every matrix it compresses (a tensor viewed as n = shape[0] rows, m = the rest), the whole
    tensor for those it does not (1-D tensors, and matrices where (n + m) r * 2 >= n m)."""
    total = 0
    for s in shapes:
        numel = math.prod(s)
        if len(s) < 2:
            total += numel
            continue
        n, m = s[0], numel // s[0]
        r = min(rank, n, m)
        total += (n + m) * r if (n + m) * r * MIN_COMPRESSION_RATE < n * m else numel
    return 4 * total


def powersgd_compute_ms(shapes, rank: int, repeat: int = 3) -> float:
    """Median ms, on this process's threads, of PowerSGD's arithmetic on ``shapes`` at ``rank``:
    per compressed matrix M (n x m): M += error, P = M Q, orthogonalize P (QR), Q = M^T P,
    M' = P Q^T, error = M - M' (PyTorch's hook, with the allreduces left out)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    mats = []
    for s in shapes:
        numel = math.prod(s)
        if len(s) < 2:
            continue
        n, m = s[0], numel // s[0]
        r = min(rank, n, m)
        if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
            mats.append((torch.randn(n, m, generator=gen), torch.zeros(n, m), torch.randn(m, r, generator=gen)))
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for grad, error, q in mats:
            m_ = grad + error
            p = m_ @ q
            p, _ = torch.linalg.qr(p)
            q = m_.t() @ p
            approx = p @ q.t()
            torch.sub(m_, approx, out=error)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure_inputs(compute_ms: float, repeat: int = 3, in_situ: Optional[Dict[str, float]] = None,
                   contention: Optional[Dict[int, float]] = None,
                   in_situ_cpu: Optional[Dict[str, float]] = None) -> Inputs:
    """Measure the codec and PowerSGD inputs here, on one thread;
    ``compute_ms`` is given (from ``bench exchange --np 1 --configs none``), and so are the
    optional ``in_situ`` steps and their ``in_situ_cpu`` time (:func:`measure_in_situ`) and
    ``contention`` (:func:`measure_contention`)."""
    import torch
    from .codecs_bench import run_bench
    from .shapes import resnet50_shapes, total_numel
    torch.set_num_threads(1)        # one core per rank (also the native kernels' OpenMP threads)
    shapes = resnet50_shapes()
    specs = [("fp16", {})] + list(CODECS.values())
    rows = run_bench(specs, ["native"], repeat)
    by = {}
    for row in rows:
        for key, (name, opts) in CODECS.items():
            if row["codec"] == name and row.get("options", {}) == opts:
                by[key] = {"encode_ms": row["encode_ms"], "decode_ms": row["decode_ms"], "bytes": row["bytes"],
                           "dmean1_ms": decode_mean_ms(name, opts, 1, repeat),
                           "dmean8_ms": decode_mean_ms(name, opts, 8, repeat)}
    fp16 = next({"encode_ms": r["encode_ms"], "decode_ms": r["decode_ms"]} for r in rows if r["codec"] == "fp16")
    psgd = {r: {"compute_ms": powersgd_compute_ms(shapes, r, repeat), "bytes": powersgd_factor_bytes(shapes, r)}
            for r in POWERSGD_RANKS}
    load = os.getloadavg()
    return Inputs(total_numel(shapes), compute_ms, by, fp16, psgd,
                  source=f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
                         f"{load[0]:.2f}, torch threads {__import__('torch').get_num_threads()}",
                  in_situ=dict(in_situ or {}), contention=dict(contention or {}), in_situ_cpu=dict(in_situ_cpu or {}))


#: ``bench exchange`` configs whose -np IN_SITU_NP step is each method's in-situ input (not the
#: dense ones: their in-situ step would include the allreduce of the whole model).
IN_SITU_CONFIGS = {"onebit:pattern=allgather": "onebit/allgather",
                   "onebit:pattern=two_phase": "onebit/two_phase", "terngrad:pattern=allgather": "terngrad/allgather",
                   "terngrad:pattern=two_phase": "terngrad/two_phase", "qsgd:bits=4,pattern=allgather": "qsgd4/allgather",
                   "qsgd:bits=4,pattern=two_phase": "qsgd4/two_phase", "dgc:density=0.001": "dgc/allgather",
                   "ddp_powersgd:rank=1": "powersgd1", "ddp_powersgd:rank=4": "powersgd4"}


IN_SITU_NP = 2


def measure_in_situ(timeout: float, steps: int = 5) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Each method's whole step at -np IN_SITU_NP (``bench exchange --net none``), by method
    label: (wall ms per step, CPU ms one rank took per step)."""
    from . import exchange_bench as eb
    ns = _exchange_args(np=IN_SITU_NP, net="none", rates=None, shapes="resnet50", steps=steps, warmup=2, timeout=timeout)
    rows = [r for r in eb.launch(ns, list(IN_SITU_CONFIGS), [None])
            if r.get("config") in IN_SITU_CONFIGS and "ms_per_step" in r and "skipped" not in r]
    return ({IN_SITU_CONFIGS[r["config"]]: r["ms_per_step"] for r in rows},
            {IN_SITU_CONFIGS[r["config"]]: r["cpu_ms_per_step"] for r in rows if "cpu_ms_per_step" in r})


def _contention_worker(barrier, queue, repeat: int) -> None:
    """One process of :func:`measure_contention`: the median ms of onebit's encode and
    decode of the whole ResNet-50 gradient set plus an SGD-like pass, after the others are ready."""
    import torch
    torch.set_num_threads(1)
    from .. import get_codec
    from .codecs_bench import make_gradients
    from .shapes import resnet50_shapes
    codec = get_codec("onebit", impl="native")
    grads = make_gradients(resnet50_shapes())
    params = [torch.zeros_like(g) for g in grads]

    def step():
        for g, p in zip(grads, params):
            codec.decode(codec.encode(g), out=p)
            p.add_(g, alpha=-1e-9)
    step()
    barrier.wait()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    queue.put(statistics.median(times))


def measure_contention(max_procs: int, repeat: int = 5) -> Dict[int, float]:
    """procs -> (mean step of ``procs`` processes running at once) / (the step alone), for
    procs = 2 .. ``max_procs``: how much ranks on one machine slow each other down (memory
    bandwidth, shared caches) when each has a core of its own."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    alone = None
    out: Dict[int, float] = {}
    for procs in range(1, max_procs + 1):
        barrier, queue = ctx.Barrier(procs), ctx.Queue()
        workers = [ctx.Process(target=_contention_worker, args=(barrier, queue, repeat)) for _ in range(procs)]
        for w in workers:
            w.start()
        times = [queue.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        if procs == 1:
            alone = times[0]
        else:
            out[procs] = round(statistics.fmean(times) / alone, 3)
    return out


# -- tables ---------------------------------------------------------------------------

def table(inputs: Inputs, ks: Sequence[int] = KS, rates: Sequence[float] = RATES_GBIT, alpha_s: float = 25e-6) -> str:
    """Markdown: per link rate, predicted ms per step of every method (rows) at every K
    (columns), the fastest in bold, then which method wins at each (K, rate)."""
    out = []
    wins = {}
    for g in rates:
        out += [f"### {g} Gbit/s per rank (PREDICTED ms per step)", "",
                "| method | " + " | ".join(f"K={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
        preds = {m: [predict(m, k, g * 1e9, inputs, alpha_s=alpha_s)["step_ms"] for k in ks] for m in methods()}
        best = [min(preds[m][j] for m in preds) for j in range(len(ks))]
        for j, k in enumerate(ks):
            wins[(g, k)] = min(preds, key=lambda m: preds[m][j])
        for m, vals in preds.items():
            cells = [f"**{v:.0f}**" if v == best[j] else f"{v:.0f}" for j, v in enumerate(vals)]
            out.append(f"| {m} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["### Fastest method (PREDICTED)", "", "| rate | " + " | ".join(f"K={k}" for k in ks) + " |",
            "|---|" + "---|" * len(ks)]
    for g in rates:
        out.append(f"| {g} Gbit/s | " + " | ".join(wins[(g, k)] for k in ks) + " |")
    return "\n".join(out)


def inputs_table(inputs: Inputs) -> str:
    """Markdown: the measured inputs."""
    lines = [f"Model: {inputs.numel:,} values; compute-only step {inputs.compute_ms:.1f} ms. {inputs.source}", "",
             "| input | encode ms | decode ms (one payload) | decode-mean of 1 / 8 payloads, ms | bytes per payload |",
             "|---|---|---|---|---|"]
    for key, c in inputs.codecs.items():
        dm = f"{c['dmean1_ms']:.1f} / {c['dmean8_ms']:.1f}" if "dmean8_ms" in c else "-"
        lines.append(f"| {key} | {c['encode_ms']:.1f} | {c['decode_ms']:.1f} | {dm} | {c['bytes']:,} |")
    lines.append(f"| fp16 casts | {inputs.fp16['encode_ms']:.1f} | {inputs.fp16['decode_ms']:.1f} | - | "
                 f"{2 * inputs.numel:,} |")
    for r, p in inputs.powersgd.items():
        lines.append(f"| PowerSGD rank {r} | {p['compute_ms']:.1f} (all its arithmetic) | - | - | "
                     f"{p['bytes']:,} (allreduced) |")
    if inputs.in_situ:
        lines += ["", f"In situ (each method's whole step at -np {IN_SITU_NP}, no rate limit, ms): "
                  + ", ".join(f"{m} {v:.1f}" for m, v in inputs.in_situ.items())]
        if inputs.in_situ_cpu:
            lines += ["", "CPU time one rank took per step there (ms; all its threads): "
                      + ", ".join(f"{m} {v:.1f}" for m, v in inputs.in_situ_cpu.items())]
    if inputs.contention:
        lines += ["", "Contention (ranks computing at once on this machine -> slowdown): "
                  + ", ".join(f"{p}: {f:.2f}x" for p, f in sorted(inputs.contention.items()))]
    return "\n".join(lines)


# -- check against the harness ------------------------------------------------------------

CHECK_CONFIGS = {"none": "fp32", "fp16": "fp16", "onebit:pattern=allgather": "onebit/allgather",
                 "terngrad:pattern=allgather": "terngrad/allgather",
                 "qsgd:bits=4,pattern=allgather": "qsgd4/allgather", "dgc:density=0.001": "dgc/allgather",
                 "onebit:pattern=two_phase": "onebit/two_phase", "terngrad:pattern=two_phase": "terngrad/two_phase",
                 "qsgd:bits=4,pattern=two_phase": "qsgd4/two_phase"}


def compare(rows: Sequence[dict], inputs: Inputs, cores: float, alpha_s: float) -> List[dict]:
    """Predicted (loopback layout, ``cores`` shared) against each measured ``bench exchange`` row."""
    out = []
    for r in rows:
        method = CHECK_CONFIGS.get(r["config"])
        if method is None or "skipped" in r or not r.get("rate_bits_per_s"):
            continue
        p = predict(method, r["k"], r["rate_bits_per_s"], inputs, alpha_s=alpha_s, layout=r["net"], cores=cores)
        out.append({"config": r["config"], "k": r["k"], "rate": r["rate"], "measured_ms": r["ms_per_step"],
                    "predicted_ms": round(p["step_ms"], 1),
                    "rel_error": round((p["step_ms"] - r["ms_per_step"]) / r["ms_per_step"], 3)})
    return out


def format_check(results: Sequence[dict]) -> str:
    lines = ["config  K  rate  measured_ms  predicted_ms  rel_error"]
    lines += [f"{c['config']}  {c['k']}  {c['rate']}  {c['measured_ms']:.1f}  {c['predicted_ms']:.1f}  "
              f"{100 * c['rel_error']:+.1f}%" for c in results]
    return "\n".join(lines)


def run_check(args, inputs: Inputs) -> List[dict]:
    """Run ``bench exchange`` at each of ``--check-np`` on the loopback harness at 1 Gbit/s and compare."""
    from . import exchange_bench as eb
    from .shapes import total_numel
    numel = total_numel(eb._shapes(args.shapes))
    if numel != inputs.numel:
        raise ValueError(f"the inputs describe a model of {inputs.numel:,} values, --shapes {args.shapes} has "
                         f"{numel:,}: measure the inputs for the shapes checked")
    rows = []
    for np_ in args.check_np:
        ns = _exchange_args(np=np_, net="loopback", rates="1gbit", shapes=args.shapes, steps=args.steps,
                           warmup=1, timeout=args.timeout)
        rows += eb.launch(ns, list(CHECK_CONFIGS), ["1gbit"])
    return compare(rows, inputs, args.cores, args.alpha_us * 1e-6)


# -- command line -----------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--inputs", default=None, metavar="JSON", help="measured inputs (written by --measure)")
    parser.add_argument("--measure", action="store_true", help="measure the inputs here and write them to --inputs")
    parser.add_argument("--compute-ms", type=float, default=None,
                        help="with --measure: the compute-only step (bench exchange --np 1 --configs none); "
                             "default: measured now by that command")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-in-situ", dest="in_situ", action="store_false",
                        help="with --measure: skip the in-situ -np 2 steps and the contention factor "
                             "(the model then adds isolated codec times to the compute-only step)")
    parser.add_argument("--alpha-us", type=float, default=25.0, help="latency per message, microseconds (25)")
    parser.add_argument("--markdown", default=None, metavar="PATH", help="write the inputs and tables as markdown")
    parser.add_argument("--check", action="store_true",
                        help="compare with bench exchange on the loopback harness at --check-np, 1 Gbit/s")
    parser.add_argument("--check-np", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    parser.add_argument("--cores", type=float, default=float(os.cpu_count() or 1),
                        help="cores the harness's ranks share (--check)")
    parser.add_argument("--shapes", choices=("resnet50", "small"), default="resnet50", help="--check's shapes")
    parser.add_argument("--steps", type=int, default=3, help="--check's timed steps per config")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--nodes", action="store_true",
                        help="also print the table of N nodes x --per-node GPUs: flat vs hierarchical exchanges "
                             "(bench/cost_nodes.py)")
    parser.add_argument("--per-node", type=int, default=8, help="--nodes: GPUs per node (8)")
    parser.add_argument("--inter-gbit", type=float, default=25.0, help="--nodes: Gbit/s per GPU between nodes (25)")
    parser.add_argument("--intra-gbyte", type=float, default=150.0, help="--nodes: GB/s inside a node (150)")


def _exchange_args(**overrides) -> argparse.Namespace:
    """``bench exchange``'s arguments at their defaults, with ``overrides``."""
    from . import exchange_bench as eb
    parser = argparse.ArgumentParser()
    eb.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def _compute_only_ms(args) -> float:
    from . import exchange_bench as eb
    ns = _exchange_args(np=1, net="none", rates=None, shapes="resnet50", steps=5, warmup=2, timeout=args.timeout)
    rows = eb.launch(ns, ["none"], [None])
    return rows[0]["ms_per_step"]


def run(args: argparse.Namespace) -> int:
    try:
        if args.measure:
            compute = args.compute_ms if args.compute_ms is not None else _compute_only_ms(args)
            in_situ, in_situ_cpu = measure_in_situ(args.timeout) if args.in_situ else ({}, {})
            contention = measure_contention(int(args.cores)) if args.in_situ and args.cores >= 2 else {}
            inputs = measure_inputs(compute, args.repeat, in_situ, contention, in_situ_cpu)
            if args.inputs:
                with open(args.inputs, "w") as f:
                    json.dump(inputs.to_json(), f, indent=1)
        elif args.inputs:
            with open(args.inputs) as f:
                inputs = Inputs.from_json(json.load(f))
        else:
            raise ValueError("give --inputs JSON (measured earlier) or --measure")
    except (ValueError, RuntimeError, OSError) as exc:
        print(f"[model] error: {exc}", file=sys.stderr)
        return 2
    text = ("PREDICTED by the cost model (bench/cost_model.py), not measured.\n\n" + inputs_table(inputs) + "\n\n"
            + table(inputs, alpha_s=args.alpha_us * 1e-6))
    if args.nodes:
        from .cost_nodes import nodes_table
        text += "\n\n" + nodes_table(inputs, per_node=args.per_node, inter_gbit=args.inter_gbit,
                                      intra_gbyte=args.intra_gbyte, alpha_s=args.alpha_us * 1e-6)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# Cost model: PREDICTED step times\n\n" + __doc__.split("\n\n", 1)[1] + "\n" + text + "\n")
    if args.check:
        try:
            results = run_check(args, inputs)
        except (ValueError, RuntimeError) as exc:
            print(f"[model] error: {exc}", file=sys.stderr)
            return 2
        print(format_check(results))
        if results:
            print(f"mean |relative error|: {100 * statistics.fmean(abs(c['rel_error']) for c in results):.1f}%")
    return 0
