"""``python -m horovod_gradcomp.bench fsdp``: FSDP2's step time with and without a codec on a slow network.

Steps examples/train_fsdp.py's character transformer (FSDP2, every block its own unit) on the
slow-network harness (:mod:`.slownet`), once per layout and link rate, with dense FSDP2 and every
codec at its defaults in the same run, side by side (:mod:`.fsdp_step_worker`: the rows alternate
step by step; a step is timed from a barrier and counts as the slowest rank's). Layouts:

* ``sharded``: K ranks, one namespace each (``bridge``: one limited full-duplex link per rank, as
  on a switch); FSDP2 shards over all K and the codecs run inside its reduce-scatter;
* ``hsdp``: ``--nodes`` namespaced nodes of K/nodes ranks (``bridge`` with ``per_node``: shared
  memory and an unlimited loopback inside a node, limited links between nodes); FSDP2 shards over
  the node's ranks (dense FSDP2: its own HSDP on the 2-D mesh, a dense all-reduce between nodes;
  a codec: HSDP mode of ``hgc.fsdp.register``, the codec between nodes).

Every row's parameters are all-gathered densely by FSDP2 before forward and again in backward
(the codecs compress the reduce-scatter only): in sharded mode those all-gathers cross the same
limited links; in HSDP they stay inside the node.

Output: a table on stdout (median ms per step after the warm-up, per layout and rate, and the
ratio to dense FSDP2 of the same run); ``--json PATH`` (``{"meta": ..., "rows": [...]}``, each row
with every timed step); ``--markdown PATH`` (the table under the command, the machine and the load
average). ``--from-json PATH`` reports a JSON written earlier.

``--quick``: K=2 on the loopback harness at 1 Gbit/s, sharded only, dense FSDP2 and onebit, 3 timed
steps after 1 warm-up: a check that the whole path runs (tests/test_bench_fsdp.py), not a
measurement. Options given explicitly override the preset.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List

from . import slownet

COMMAND = "fsdp"
HELP = "FSDP2 step time, dense and every codec (sharded and HSDP), on the slow-network harness"

FULL = dict(np=4, nodes=2, layouts="sharded,hsdp", rates="100mbit,1gbit", net="bridge", codecs=None, steps=20,
            warmup=3)
QUICK = dict(np=2, nodes=2, layouts="sharded", rates="1gbit", net="loopback", codecs="onebit", steps=3, warmup=1)
LAYOUTS = ("sharded", "hsdp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .cost_cluster_args import positive_int
    parser.add_argument("--quick", action="store_true",
                        help="the small check: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--np", type=positive_int, default=None, help=f"ranks K ({FULL['np']})")
    parser.add_argument("--nodes", type=positive_int, default=None,
                        help=f"HSDP: namespaced nodes the K ranks split into ({FULL['nodes']})")
    parser.add_argument("--layouts", default=None,
                        help=f"comma-separated from {', '.join(LAYOUTS)} ({FULL['layouts']})")
    parser.add_argument("--rates", default=None, help=f"comma-separated tc rates ({FULL['rates']})")
    parser.add_argument("--net", choices=("bridge", "loopback", "none"), default=None,
                        help=f"the sharded layout's harness ({FULL['net']}; HSDP always runs on bridge nodes)")
    parser.add_argument("--codecs", default=None, help="comma-separated codecs (default: every available one)")
    parser.add_argument("--steps", type=positive_int, default=None, help=f"timed steps per row ({FULL['steps']})")
    parser.add_argument("--warmup", type=int, default=None, help=f"untimed steps per row first ({FULL['warmup']})")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd")
    parser.add_argument("--model", default="", help="extra options of examples/train_fsdp.py, e.g. '--width 128'")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per harness run (1800)")
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--markdown", default=None, metavar="PATH")
    parser.add_argument("--from-json", default=None, metavar="PATH", help="report a JSON written earlier; no run")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset from the preset and check them (ValueError naming the bad one)."""
    import horovod_gradcomp as hgc
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    known = hgc.available_codecs()
    codecs = [c.strip() for c in args.codecs.split(",")] if args.codecs else list(known)
    bad = [c for c in codecs if c not in known]
    if bad:
        raise ValueError(f"--codecs: unknown {bad}; available: {', '.join(known)}")
    args.rows = ",".join(["none", *codecs])
    layouts = [x.strip() for x in args.layouts.split(",")]
    bad = [x for x in layouts if x not in LAYOUTS]
    if bad:
        raise ValueError(f"--layouts: unknown {bad}; known: {', '.join(LAYOUTS)}")
    if "hsdp" in layouts and (args.nodes < 2 or args.np % args.nodes or args.np == args.nodes):
        raise ValueError(f"--layouts hsdp: the {args.np} ranks must split into --nodes {args.nodes} >= 2 equal nodes "
                         "of 2 or more ranks")
    if args.net == "none" and "hsdp" in layouts:
        raise ValueError("--net none has no namespaced nodes: HSDP runs on the bridge harness")
    args.layouts = layouts
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    return args


def worker_argv(args: argparse.Namespace, layout: str, net: str, rate: str, out: str) -> List[str]:
    """The command every rank runs for one (layout, rate)."""
    return [sys.executable, "-m", "horovod_gradcomp.bench.fsdp_step_worker", "--rows", args.rows,
            "--hsdp", str(args.nodes if layout == "hsdp" else 0), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--optimizer", args.optimizer, f"--model={args.model}", "--net", net,
            "--rate", rate, "--json", out]


def launch(args: argparse.Namespace) -> List[dict]:
    """One harness run per (layout, rate); RuntimeError when one fails."""
    from .tta_bench import ROOT
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    rows: List[dict] = []
    for layout in args.layouts:
        net = "bridge" if layout == "hsdp" else args.net
        per_node = args.np // args.nodes if layout == "hsdp" else 1
        for rate in (["unlimited"] if net == "none" else args.rates.split(",")):
            print(f"[fsdp] {layout}: mpirun -np {args.np} on net {net}"
                  f"{f' as {args.nodes} nodes' if layout == 'hsdp' else ''} at {rate}: rows {args.rows}",
                  file=sys.stderr, flush=True)
            got = slownet.run_rows(net, args.np, lambda out: worker_argv(args, layout, net, rate, out),
                                   None if net == "none" else rate, label=f"{layout} {rate}", timeout=args.timeout,
                                   env=env, per_node=per_node, hint="; its output is above")
            rows += [dict(r, layout=layout) for r in got]
    return rows


def table(rows: List[dict]) -> str:
    """Median ms per step per row, one column pair (ms, vs dense) per (layout, rate)."""
    runs = list(dict.fromkeys((r["layout"], r["rate"]) for r in rows))
    names = list(dict.fromkeys(r["row"] for r in rows))
    head = "| exchange | " + " | ".join(f"{lay} {rate} ms | vs dense" for lay, rate in runs) + " |"
    out = [head, "|---|" + "---:|---:|" * len(runs)]
    for name in names:
        cells = []
        for lay, rate in runs:
            mine = {r["row"]: r for r in rows if (r["layout"], r["rate"]) == (lay, rate)}
            r, dense = mine.get(name), mine.get("none")
            if r is None:
                cells += ["-", "-"]
                continue
            ratio = f"{dense['median_ms'] / r['median_ms']:.2f}x" if dense else "-"
            cells += [f"{r['median_ms']:.1f}", ratio]
        label = "FSDP2 dense (fp32)" if name == "none" else name
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def report(meta: dict, rows: List[dict], markdown) -> str:
    from .tta_bench import print_report
    loads = [r["load_average"] for r in rows]
    where = []
    if "sharded" in meta["layouts"]:
        where.append(f"sharded on the {meta['net']} harness")
    if "hsdp" in meta["layouts"]:
        where.append(f"HSDP as {meta['nodes']} namespaced nodes of {meta['np'] // meta['nodes']} ranks")
    text = (f"{meta['machine']}\n\nK = {meta['np']}; {', '.join(where)}; {rows[0]['parameters']:,} parameters, "
            f"{meta['optimizer']}; median of {meta['steps']} "
            f"timed steps after {meta['warmup']} warm-up steps, each the slowest rank's. Load average (1 min) at the "
            f"end of each row: {min(loads):.2f} to {max(loads):.2f}.\n\n{table(rows)}\n")
    return print_report(text, markdown, "FSDP2 step time on the slow-network harness (measured)", meta["command"])


def run(args: argparse.Namespace) -> int:
    from .tta_bench import machine_line, saved_run
    try:
        if args.from_json:
            report(*saved_run(args.from_json), args.markdown)
            return 0
        resolve(args)
        rows = launch(args)
    except slownet.HARNESS_ERRORS as exc:
        return slownet.error_status("fsdp", exc)
    keys = ("np", "nodes", "layouts", "rates", "net", "rows", "steps", "warmup", "optimizer", "model", "quick")
    meta = {k: getattr(args, k) for k in keys}
    meta.update(machine=machine_line(), command="python -m horovod_gradcomp.bench " + " ".join(sys.argv[1:]))
    report(meta, rows, args.markdown)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return 0
