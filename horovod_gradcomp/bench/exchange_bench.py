"""``python -m horovod_gradcomp.bench exchange``: time per optimizer step of stock Horovod with
each compression, on a (rate-limited) network.

What one step is, on every rank: ``zero_grad()``, a backward pass that only hands every
parameter a fixed gradient (drawn once per rank: N(0, 1), seed 1 + rank), and ``step()``
of ``hvd.DistributedOptimizer(SGD(lr=1e-9, momentum=0), compression=C)``. So a step is
Horovod's hooks, the compression's encode / exchange / decode and the SGD update: no
model compute. Parameters have ResNet-50's shapes (``--shapes small``: eight tensors,
0.5 M values, for tests). Each config gets fresh parameters and a fresh optimizer, and is
measured after the previous one finished, so configs never overlap.

Configs (``--configs``, comma-separated; options ``name:key=value,key=value``):

* ``none``, ``fp16``: Horovod's own allreduce (fp32 / fp16 on the wire) through
  ``hgc.Compression.none()`` / ``.fp16()``, which only count bytes;
* a codec name with options, e.g. ``onebit``, ``qsgd:bits=4``, ``dgc:density=0.001``,
  ``onebit:pattern=two_phase``: built by the codec's own factory when ``hgc.Compression``
  has one (``Compression.onebit``, ...: the defaults users get), else by
  ``hgc.Compression.codec(name, ...)``. Options are passed through as keyword arguments;
  a config the adapter rejects (TypeError / ValueError) is skipped on every rank and
  reported. The default list has the ``pattern=two_phase`` variants only when
  ``Compression.codec`` accepts ``pattern``.
* ``CODEC:...,poll=SECONDS``: the codec's collectives through
  :class:`~horovod_gradcomp.transports.mpi_polling.PollingCommunicator` (nonblocking collectives,
  tested every SECONDS with sleeps in between: the waiting rank leaves the core to others);
* ``local``: the same step with a plain ``torch.optim.SGD`` and no communication (the
  compute-only step; ``--breakdown`` adds it first);
* ``ddp``, ``ddp_fp16``, ``ddp_powersgd:rank=R``: PyTorch DDP with its own allreduce, its fp16
  hook or its PowerSGD hook, and ``ddp_<codec>[:options]`` (``ddp_onebit``, ``ddp_dgc:density=0.001``,
  ``ddp_onebit:per_bucket=False``): DDP with this package's hook (``hgc.ddp.register``), on gloo,
  in the same processes and harness run (:mod:`horovod_gradcomp.bench.ddp_rows`); the default
  list ends with ``ddp_powersgd:rank=1`` and ``ddp_powersgd:rank=4``. ``--ddp-backward resnet50``
  gives the DDP rows a real ResNet-50 forward and backward (``--ddp-batch`` images of
  ``--ddp-image`` pixels), so that buckets' exchanges can overlap backward; the default
  (``inject``) is the Horovod rows' injected gradients.

``--breakdown PREFIX`` records every timed step's phases (:mod:`horovod_gradcomp.bench.breakdown`)
and writes ``PREFIX.json`` and ``PREFIX.png``.

Figures per config: ``ms_per_step``, the median over ``--steps`` timed steps (after
``--warmup`` untimed ones) of the slowest rank's step; ``bytes_sent_per_step``, what one
rank transmits per step (``compression.stats()``, mean over ranks, timed steps only);
``link_ms``, the time those bytes need on the limited link(s) (loopback: all K ranks'
bytes through one link; bridge: one rank's bytes through its own link).

Two ways to run it:

* under mpirun (any launcher Horovod accepts): measures in place; ``--net`` / ``--rates``
  only label the rows;
* without mpirun: launches itself, once per rate in ``--rates``, under
  ``mpirun -np --np`` on the ``--net`` harness (:mod:`horovod_gradcomp.bench.slownet`;
  ``none`` is plain mpirun) and gathers every run's rows. All configs of one rate are
  measured in the same run, side by side.

Output: a table on stdout, ``--json PATH`` (a list of rows; skipped configs are rows with
a ``skipped`` reason), ``--plot PATH.png`` (ms per step against bandwidth, one line per
config, log-log). Rate-limited timings compare configs within one run; they are not
absolute claims about a cluster.
"""
from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from . import ddp_rows, slownet
from .codecs_bench import make_gradients, parse_codec_spec
from .shapes import Shape, resnet50_shapes, total_numel
from .timing import LR, timed_steps

COMMAND = "exchange"
HELP = "ms per Horovod optimizer step with each compression, on a rate-limited network"

DENSE = ("none", "fp16")
#: Options a codec is measured with by default (others: none).
PRESETS = {"qsgd": "qsgd:bits=4", "dgc": "dgc:density=0.001"}
SMALL_SHAPES: List[Shape] = [(64, 3, 7, 7), (64,), (64,), (256, 64, 3, 3), (256,), (256,), (100, 2048), (100,)]
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "HOROVOD_RANK")


# -- configs --------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    """One measured setting: ``label`` as given, codec (or dense) ``name``, its ``options``."""

    label: str
    name: str
    options: Dict[str, object] = field(default_factory=dict)


def parse_config(text: str) -> Config:
    """``"qsgd:bits=4,pattern=two_phase"`` -> Config(name "qsgd", options {bits: 4, pattern:
    "two_phase"}); ``:`` also separates options. Values are Python literals when they parse."""
    name, options = parse_codec_spec(text.strip().replace(",", ":"))
    if not name:
        raise ValueError(f"empty config name in {text!r}")
    return Config(text.strip(), name, options)


def split_configs(text: str) -> List[str]:
    """Split a comma-separated config list where options are comma-separated too: a piece
    with ``=`` but no ``:`` continues the previous config (``"none,qsgd:bits=4,bucket=512"``
    -> ``["none", "qsgd:bits=4,bucket=512"]``)."""
    out: List[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece and out:
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def adapter_accepts(option: str) -> bool:
    """Whether ``hgc.Compression.codec`` takes keyword ``option`` by name (its ``**options``
    go to the codec class, which rejects unknown keys)."""
    import horovod_gradcomp as hgc
    return option in inspect.signature(hgc.Compression.codec).parameters


def _with_option(config: str, option: str) -> str:
    return config + ("," if ":" in config else ":") + option


def default_configs() -> tuple[List[str], List[str]]:
    """(configs to measure, variants left out with the reason): ``none``, ``fp16``, every
    registered codec (options from :data:`PRESETS`) at its default pattern, then each
    fixed-size codec with the other pattern pinned (``pattern=two_phase`` for a codec whose
    ``default_pattern`` is "allgather", else ``pattern=allgather``) when the adapter accepts
    ``pattern``."""
    import horovod_gradcomp as hgc
    from ..codecs.registry import codec_class
    codecs = [PRESETS.get(name, name) for name in hgc.available_codecs()]
    variants = [_with_option(c, "pattern=two_phase" if codec_class(name).default_pattern == "allgather"
                             else "pattern=allgather")
                for c, name in zip(codecs, hgc.available_codecs())
                if not codec_class(name).variable_size]
    ddp = list(ddp_rows.DEFAULT_ROWS) if ddp_rows.available() else []
    if adapter_accepts("pattern"):
        return list(DENSE) + codecs + variants + ddp, []
    return list(DENSE) + codecs + ddp, [f"{c} (Compression.codec has no 'pattern' option yet)" for c in variants]


def make_compression(cfg: Config, named_parameters):
    """(compression object, how it was built) for ``cfg``; raises TypeError / ValueError
    when the adapter rejects the config."""
    import horovod_gradcomp as hgc
    factories = hgc.Compression
    if cfg.name in DENSE:
        if cfg.options:
            raise ValueError(f"{cfg.name} takes no options, got {cfg.options}")
        return getattr(factories, cfg.name)(), f"Compression.{cfg.name}"
    if cfg.name not in hgc.available_codecs():
        raise ValueError(f"unknown codec {cfg.name!r}; available: {', '.join(hgc.available_codecs())}")
    options = dict(cfg.options)
    if "poll" in options:    # the bench's own option: waits through the polling communicator
        from ..transports.mpi_polling import PollingCommunicator
        interval = options.pop("poll")
        if not isinstance(interval, (int, float)) or interval <= 0:
            raise ValueError(f"{cfg.label}: poll=SECONDS must be a positive number, got {interval!r}")
        options["communicator"] = PollingCommunicator(interval_s=float(interval))
    own = getattr(factories, cfg.name, None)
    if callable(own):
        return own(named_parameters, **options), f"Compression.{cfg.name}"
    return factories.codec(cfg.name, named_parameters, **options), "Compression.codec"


# -- one rank's measurement --------------------------------------------------------------

def _inject_grads_function():
    """An autograd Function whose backward hands each parameter a copy of a fixed gradient
    (so Horovod's hooks on the gradient accumulators fire as in training)."""
    import torch

    class InjectGrads(torch.autograd.Function):
        @staticmethod
        def forward(ctx, grads, *params):
            ctx.grads = grads
            return params[0].new_zeros(())

        @staticmethod
        def backward(ctx, _):
            # Copies: AccumulateGrad then keeps them as p.grad, and the fixed values stay intact.
            return (None, *(g.clone() for g in ctx.grads))

    return InjectGrads


def time_config(hvd, cfg: Config, shapes: Sequence[Shape], grads, steps: int, warmup: int,
                record: bool = False) -> dict:
    """Measure ``cfg`` on this rank: per-step seconds of the timed steps and the stats
    deltas over them; with ``record``, also ``breakdown``: each timed step's phases
    (:mod:`horovod_gradcomp.bench.breakdown`). Raises TypeError / ValueError when the config
    cannot be built."""
    import torch
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    named = [(f"t{i:03d}", p) for i, p in enumerate(params)]
    compression, factory = make_compression(cfg, named)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(params, lr=LR, momentum=0.0), named_parameters=named,
                                   compression=compression)
    inject = _inject_grads_function()
    timeline = None
    if record:
        from .breakdown import instrument, recorded_step
        from ..exchange.timeline import Timeline
        timeline = Timeline()
        instrument(compression, timeline)

    def step():
        if timeline is not None:
            return recorded_step(opt, timeline, lambda: inject.apply(grads, *params).backward())
        opt.zero_grad()
        inject.apply(grads, *params).backward()
        opt.step()

    for _ in range(warmup):
        step()
    hvd.barrier()
    if timeline is not None:
        timeline.take()    # the warm-up steps
    before = compression.stats()
    timed = timed_steps(step, steps)
    after = compression.stats()
    done = max(after["steps"] - before["steps"], 0)     # 0 with one rank: Horovod calls no hooks

    def per_step(key: str) -> float:
        return (after[key] - before[key]) / done if done else 0.0

    out = dict(timed, factory=factory, bytes_sent=per_step("bytes_sent"), bytes_dense=per_step("bytes_dense"))
    if "bytes_sent_intra_node" in after:   # the hierarchical pattern's dense steps inside the node
        out["bytes_intra"] = per_step("bytes_sent_intra_node")
    if timeline is not None:
        from .breakdown import step_phases
        out["breakdown"] = step_phases(timeline)
    return out


def _try_time(hvd, cfg, shapes, grads, steps, warmup, record=False, net="none", ddp_step=None) -> dict:
    """:func:`time_config`, or ``{"error": ...}`` when the config is rejected. The decision is
    made identically on every rank (it depends on the config, not on data)."""
    try:
        if cfg.name == "local":
            from .breakdown import time_local
            return time_local(cfg, shapes, grads, steps, warmup, _inject_grads_function())
        if ddp_rows.is_ddp(cfg.name):
            return ddp_rows.time_ddp(hvd, cfg, shapes, grads, steps, warmup, net, _inject_grads_function(),
                                     **(ddp_step or {}))
        return time_config(hvd, cfg, shapes, grads, steps, warmup, record)
    except (TypeError, ValueError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    finally:
        gc.collect()    # the optimizer's hooks and the parameters form cycles: free them now


def summarize(cfg: Config, per_rank: List[dict], k: int, numel: int, net: str, rate: Optional[str],
              steps: int, warmup: int) -> dict:
    """One row from every rank's :func:`time_config` result (all ranks' lists, rank order)."""
    row: dict = {"config": cfg.label, "codec": cfg.name, "options": dict(cfg.options), "k": k, "net": net,
                 "rate": rate, "rate_bits_per_s": slownet.rate_bits_per_s(rate) if rate else None,
                 "numel": numel}
    errors = sorted({r["error"] for r in per_rank if "error" in r})
    if errors:
        row["skipped"] = "; ".join(errors)
        return row
    slowest = [max(r["seconds"][i] for r in per_rank) for i in range(steps)]
    sent = statistics.fmean(r["bytes_sent"] for r in per_rank)
    dense = statistics.fmean(r["bytes_dense"] for r in per_rank)
    row.update(factory=per_rank[0]["factory"], steps=steps, warmup=warmup,
               ms_per_step=round(1e3 * statistics.median(slowest), 3), ms_min=round(1e3 * min(slowest), 3),
               bytes_sent_per_step=round(sent), bytes_dense_per_step=round(dense),
               wire_ratio=round(dense / sent, 3) if sent else None,
               link_ms=link_ms(sent, k, net, row["rate_bits_per_s"]))
    if any(r.get("bytes_intra") for r in per_rank):   # of bytes_sent_per_step: inside the node / between nodes
        intra = statistics.fmean(r.get("bytes_intra", 0.0) for r in per_rank)
        row.update(bytes_intra_node_per_step=round(intra), bytes_inter_node_per_step=round(sent - intra),
                   link_ms=link_ms(sent - intra, k, net, row["rate_bits_per_s"]))   # only these cross a link
    if all("cpu_seconds" in r for r in per_rank):   # CPU time one rank took per step, mean over ranks
        row["cpu_ms_per_step"] = round(1e3 * statistics.fmean(r["cpu_seconds"] for r in per_rank), 3)
    if per_rank[0].get("bytes_computed"):
        row["bytes_computed"] = True    # DDP rows: from the shapes, not counted (see ddp_rows.py)
    if "breakdown" in per_rank[0]:
        row["breakdown"] = [r["breakdown"] for r in per_rank]
    return row


def link_ms(bytes_per_rank: float, k: int, net: str, bits_per_s: Optional[float]) -> Optional[float]:
    """Milliseconds the step's bytes need on the limited link(s): loopback carries all ``k``
    ranks' bytes on one link, bridge each rank's on its own; None without a limit."""
    if not bits_per_s or net not in ("loopback", "bridge"):
        return None
    total = bytes_per_rank * (k if net == "loopback" else 1)
    return round(1e3 * 8 * total / bits_per_s, 3)


def measure(configs: Sequence[Config], shapes: Sequence[Shape], steps: int, warmup: int, net: str,
            rate: Optional[str], log=None, record: bool = False, ddp_step: Optional[dict] = None) -> List[dict]:
    """Run on every rank (Horovod initialized here): measure each config in turn; every
    rank returns the same rows. ``ddp_step``: keyword options of the DDP rows' step
    (``backward``, ``batch``, ``image``: :func:`~horovod_gradcomp.bench.ddp_rows.time_ddp`)."""
    import horovod.torch as hvd
    hvd.init()
    k, rank = hvd.size(), hvd.rank()
    grads = make_gradients(shapes, seed=1 + rank)
    numel = total_numel(shapes)
    # Untimed: the process's first steps fault in the allocator's pages and warm caches; without
    # this the first config measured (the ``local`` row of --breakdown) paid for it.
    _try_time(hvd, parse_config("local"), shapes, grads, max(steps, 3), warmup, False, net)
    hvd.barrier()
    rows = []
    for cfg in configs:
        mine = _try_time(hvd, cfg, shapes, grads, steps, warmup, record, net, ddp_step)
        row = summarize(cfg, hvd.allgather_object(mine), k, numel, net, rate, steps, warmup)
        if ddp_rows.is_ddp(cfg.name) and ddp_step:
            row["ddp_step"] = dict(ddp_step)
        rows.append(row)
        if log and rank == 0:
            log(format_row_brief(row))
        hvd.barrier()
    ddp_rows.close_group()
    return rows


# -- output ---------------------------------------------------------------------------

def format_row_brief(row: dict) -> str:
    """One progress line for ``row``."""
    where = f"K={row['k']} {row['net']} {row['rate'] or 'unlimited'}"
    if "skipped" in row:
        return f"[exchange] {where} {row['config']}: skipped ({row['skipped']})"
    return (f"[exchange] {where} {row['config']}: {row['ms_per_step']:.1f} ms/step, "
            f"{row['bytes_sent_per_step'] / 1e6:.2f} MB sent per rank per step")


def format_table(rows: Sequence[dict]) -> str:
    """Measured rows as an aligned table; ``vs none`` is the none config's ms over this one's
    at the same K, net and rate. Skipped configs are listed below it."""
    done = [r for r in rows if "skipped" not in r]
    base = {(r["k"], r["net"], r["rate"]): r["ms_per_step"] for r in done if r["config"] == "none"}
    head = ["config", "K", "net", "rate", "ms/step", "vs none", "MB sent/rank/step", "wire ratio", "link ms"]
    cells = []
    for r in done:
        ref = base.get((r["k"], r["net"], r["rate"]))
        cells.append([r["config"], str(r["k"]), r["net"], r["rate"] or "-", f"{r['ms_per_step']:.1f}",
                      f"{ref / r['ms_per_step']:.2f}x" if ref else "-", f"{r['bytes_sent_per_step'] / 1e6:.3f}",
                      f"{r['wire_ratio']:.1f}" if r.get("wire_ratio") else "-",
                      f"{r['link_ms']:.1f}" if r.get("link_ms") is not None else "-"])
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]

    def fmt(line):
        return "  ".join(c.ljust(w) if i in (0, 2) else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
    lines = [fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells]
    lines += [f"skipped: {r['config']} (K={r['k']}, {r['rate'] or 'unlimited'}): {r['skipped']}"
              for r in rows if "skipped" in r]
    return "\n".join(lines)


def write_plot(rows: Sequence[dict], path: str) -> bool:
    """ms per step against link rate (Gbit/s), one line per config, log-log, to ``path``.
    False (nothing written) when no row has a rate."""
    done = [r for r in rows if "skipped" not in r and r.get("rate_bits_per_s")]
    if not done:
        return False
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label in dict.fromkeys(r["config"] for r in done):
        pts = sorted((r["rate_bits_per_s"] / 1e9, r["ms_per_step"]) for r in done if r["config"] == label)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("link rate (Gbit/s)")
    ax.set_ylabel("ms per optimizer step")
    ks = sorted({r["k"] for r in done})
    nets = sorted({r["net"] for r in done})
    ax.set_title(f"Horovod step time, {total_numel_label(done)}, K={','.join(map(str, ks))}, {'/'.join(nets)}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def total_numel_label(rows: Sequence[dict]) -> str:
    """``"25.6M values"`` from the rows' numel."""
    return f"{rows[0]['numel'] / 1e6:.1f}M values"


# -- the two ways to run ----------------------------------------------------------------

def under_mpi() -> bool:
    """Whether this process was started by an MPI / Horovod launcher."""
    return any(v in os.environ for v in MPI_ENV)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def shapes_named(name: str) -> List[Shape]:
    """The shapes of ``--shapes NAME``: ResNet-50's, or the small test model's."""
    return resnet50_shapes() if name == "resnet50" else list(SMALL_SHAPES)


def worker_argv(args: argparse.Namespace, configs: Sequence[str], rate: Optional[str], json_path: str) -> List[str]:
    """The command each rank runs for one harness run (the same bench, measuring in place)."""
    argv = [sys.executable, "-m", "horovod_gradcomp.bench", COMMAND, "--worker", "--configs", ",".join(configs),
            "--steps", str(args.steps), "--warmup", str(args.warmup), "--shapes", args.shapes,
            "--net", args.net, "--json", json_path, "--ddp-backward", args.ddp_backward,
            "--ddp-batch", str(args.ddp_batch), "--ddp-image", str(args.ddp_image)] + (
                ["--record"] if args.breakdown else [])
    return argv + (["--rates", rate] if rate else [])


def launch(args: argparse.Namespace, configs: Sequence[str], rates: Sequence[Optional[str]]) -> List[dict]:
    """One harness run per rate, each measuring every config; returns all rows. Raises
    RuntimeError when a run fails (its output is on stderr)."""
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    rows: List[dict] = []
    for rate in rates:
        _log(f"[exchange] mpirun -np {args.np} on net {args.net}"
             f"{f' as nodes of {args.per_node}' if args.per_node > 1 else ''}{' at ' + rate if rate else ''}: "
             f"{len(configs)} configs, {args.warmup} + {args.steps} steps each")
        rows += slownet.run_rows(args.net, args.np, lambda out: worker_argv(args, configs, rate, out), rate,
                                 label=rate or "full speed", timeout=args.timeout, env=env, per_node=args.per_node)
    return rows


def run_in_place(args: argparse.Namespace, configs: Sequence[str]) -> Optional[List[dict]]:
    """Measure under the launcher that started this process; rows on rank 0, None elsewhere."""
    rates = _rates(args.rates)
    if len(rates) > 1:
        raise ValueError("under mpirun, --rates can only label the run with one rate")
    rows = measure([parse_config(c) for c in configs], shapes_named(args.shapes), args.steps, args.warmup,
                   args.net or "none", rates[0] if rates else None, log=_log,
                   record=bool(args.record or args.breakdown),
                   ddp_step=dict(backward=args.ddp_backward, batch=args.ddp_batch, image=args.ddp_image))
    import horovod.torch as hvd
    return rows if hvd.rank() == 0 else None


def _write_breakdowns(rows: Sequence[dict], prefix: str) -> None:
    """One breakdown (JSON + PNG) per rate, labelled with the machine's load average."""
    from .breakdown import floors, format_breakdown, format_floors, write_breakdown
    rates = list(dict.fromkeys(r["rate"] for r in rows))
    load = os.getloadavg()
    note = f"load average at the end of the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    for rate in rates:
        path = prefix if len(rates) == 1 else f"{prefix}_{rate or 'unlimited'}"
        mine = [r for r in rows if r["rate"] == rate]
        summary = write_breakdown(mine, path, note)
        print(format_breakdown(summary))
        print(format_floors(floors(mine)))
        _log(f"[exchange] breakdown: {path}.json, {path}.png ({note})")


def _rates(text: Optional[str]) -> List[str]:
    rates = [r.strip() for r in (text or "").split(",") if r.strip()]
    for r in rates:
        slownet.rate_bits_per_s(r)
    return rates


# -- command line ---------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``exchange`` subcommand."""
    parser.add_argument("--configs", default=None,
                        help="comma-separated configs: none, fp16, or CODEC[:key=value,...] "
                             "(default: none, fp16, every registered codec, and pattern=two_phase variants of "
                             "the fixed-size ones when the adapter has that option)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per config; the median is kept (5)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps before timing (2)")
    parser.add_argument("--shapes", choices=("resnet50", "small"), default="resnet50",
                        help="parameter shapes: ResNet-50's 161 tensors, or 8 small ones for tests")
    parser.add_argument("--np", type=int, default=2, help="ranks, when this command launches mpirun (2)")
    parser.add_argument("--net", choices=slownet.MODES, default=None,
                        help="network harness when launching mpirun (default loopback); under mpirun: a label")
    parser.add_argument("--per-node", type=int, default=1,
                        help="--net bridge: ranks per namespace, i.e. nodes of this many ranks with only the links "
                             "between nodes limited (1); e.g. --np 4 --per-node 2 for 2 nodes x 2")
    parser.add_argument("--rates", default=None,
                        help="comma-separated link rates, one harness run each (default 1gbit,10gbit; "
                             "none with --net none); under mpirun: one rate, a label")
    parser.add_argument("--ddp-backward", choices=ddp_rows.BACKWARDS, default="inject",
                        help="the DDP rows' backward: the injected gradients of the Horovod rows (one bucket), or a "
                             "real ResNet-50 forward and backward (DDP's buckets; see bench/ddp_rows.py)")
    parser.add_argument("--ddp-batch", type=int, default=8, help="images per rank per step, --ddp-backward resnet50 (8)")
    parser.add_argument("--ddp-image", type=int, default=64, help="image side in pixels, --ddp-backward resnet50 (64)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds allowed per harness run (1800)")
    parser.add_argument("--json", default=None, metavar="PATH", help="write the rows as a JSON list")
    parser.add_argument("--plot", default=None, metavar="PATH", help="write a PNG: ms/step vs rate per config")
    parser.add_argument("--breakdown", default=None, metavar="PREFIX",
                        help="record each timed step's phases (bench/breakdown.py) and write PREFIX.json and "
                             "PREFIX.png (one run per rate: the rate is appended to PREFIX when there are several)")
    # Set by the launching process on its ranks: no table, rows to --json only.
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--record", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Launch or measure (see the module docstring); print the table, write --json/--plot."""
    try:
        if args.configs is None:
            configs, left_out = default_configs()
            for c in left_out:
                _log(f"[exchange] not measured: {c}")
        else:
            configs = split_configs(args.configs)
            for c in configs:
                parse_config(c)    # fail here, before any launch, on a malformed config
        if args.breakdown and "local" not in configs:
            configs = ["local"] + list(configs)   # the compute-only step of the floor, in the same run
        if args.steps < 1 or args.warmup < 0:
            raise ValueError("--steps must be >= 1 and --warmup >= 0")
        if under_mpi():
            rows = run_in_place(args, configs)
        else:
            args.net = args.net or "loopback"
            rates = _rates(args.rates if args.rates is not None else
                           (None if args.net == "none" else "1gbit,10gbit"))
            if args.net != "none" and not rates:
                raise ValueError(f"--net {args.net} needs --rates")
            rows = launch(args, configs, rates or [None])
    except (ValueError, RuntimeError, slownet.SlownetUnavailable) as exc:
        _log(f"[exchange] error: {exc}")
        return 2
    if rows is None:       # ranks other than 0
        return 0
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.worker:
        return 0
    print(format_table(rows))
    if args.breakdown:
        _write_breakdowns(rows, args.breakdown)
    if args.plot and not write_plot(rows, args.plot):
        _log("[exchange] no plot: no row has a link rate (--net none)")
    return 0
