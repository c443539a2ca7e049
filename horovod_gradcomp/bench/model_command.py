"""``python -m horovod_gradcomp.bench model``: the cost model's command line.

Your cluster: ``--nodes N --gpus-per-node L --inter-node-gbit B [--intra-node-gbyte G]`` and
the model (``--params P``, ``--shapes-file JSON`` or ``--model resnet50``) print the PREDICTED
exchange time per step of every codec and pattern and of the dense allreduces on that layout,
and a recommendation with its reason (:mod:`.cost_cluster`). The codec times come from
``--inputs`` (default: the repository's ``docs/results/cost_model_inputs.json``, one CPU core)
or are measured here on this machine's device (``--calibrate``, :mod:`.cost_calibrate`).

The tables: reads the inputs (``--inputs``) or measures them (``--measure``,
:mod:`.cost_measure`), prints the model's tables (:mod:`.cost_model`; with ``--nodes`` and no
number, the N x L table of :mod:`.cost_nodes`) and, with ``--check``, the model against the
harness. The model, its formula and what it leaves out: :mod:`horovod_gradcomp.bench.cost_model`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from . import cost_model
from .cost_cluster import MIN_SPEEDUP, cluster_rows, format_cluster, recommend, scale_inputs
from .cost_fsdp import format_fsdp, fsdp_rows
from .cost_cluster_args import (NODES_TABLE, add_cluster_arguments, model_shapes, model_size, positive_float,
                                positive_int)
from .cost_measure import compute_only_ms, measure_contention, measure_in_situ, measure_inputs, run_check
from .cost_model import Inputs, format_check, inputs_table, table
from .cost_nodes import nodes_table
from .cost_nodes_check import LAYOUTS, format_nodes_check, parse_layouts, run_nodes_check

#: The model's description (its module docstring past the first paragraph), for --markdown.
MODEL_DOC = cost_model.__doc__.split("\n\n", 1)[1]

COMMAND = "model"
HELP = ("PREDICTED time per method and pattern: your cluster (--nodes N --params P) with a recommendation, or the "
        "tables from measured inputs (--check: against the harness)")


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
                        help="compare with bench exchange on the loopback harness at --check-np, 1 Gbit/s; with "
                             "--nodes, the node model on the bridge harness of real nodes at --layouts instead")
    parser.add_argument("--check-np", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4])
    parser.add_argument("--cores", type=float, default=float(os.cpu_count() or 1),
                        help="cores the harness's ranks share (--check)")
    parser.add_argument("--shapes", choices=("resnet50", "small"), default="resnet50", help="--check's shapes")
    parser.add_argument("--steps", type=int, default=3, help="--check's timed steps per config")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--nodes", nargs="?", type=positive_int, const=NODES_TABLE, default=None, metavar="N",
                        help="N: price your cluster of N nodes (with the model: --params, --shapes-file or "
                             "--model); without N: also print the table of 2..64 nodes x --per-node GPUs, flat "
                             "vs hierarchical exchanges (bench/cost_nodes.py)")
    parser.add_argument("--gpus-per-node", "--per-node", dest="per_node", type=positive_int, default=8,
                        help="--nodes: GPUs per node (8)")
    parser.add_argument("--inter-node-gbit", "--inter-gbit", dest="inter_gbit", type=positive_float, default=25.0,
                        help="--nodes: Gbit/s per GPU between nodes (25)")
    parser.add_argument("--intra-node-gbyte", "--intra-gbyte", dest="intra_gbyte", type=positive_float,
                        default=150.0, help="--nodes: GB/s between the GPUs of a node (150)")
    parser.add_argument("--calibrate", action="store_true",
                        help="--nodes N: measure the codec inputs on this machine's device (GPU if usable, else "
                             "one CPU core) instead of reading --inputs")
    parser.add_argument("--min-speedup", type=positive_float, default=MIN_SPEEDUP,
                        help=f"--nodes N: how many times faster than dense a codec's exchange must be to be "
                             f"recommended ({MIN_SPEEDUP:g})")
    parser.add_argument("--check-scaling", action="store_true",
                        help="measure how well scaling codec times by the number of values predicts them "
                             "(bench/cost_scaling_check.py), on this machine's device")
    add_cluster_arguments(parser)
    parser.add_argument("--layouts", type=parse_layouts, default=list(LAYOUTS),
                        help="--nodes --check: the harness layouts NxL (default 2x1,1x2,2x2)")
    parser.add_argument("--check-rate", default="1gbit", help="--nodes --check: the link rate between nodes (1gbit)")
    parser.add_argument("--check-intra-gbyte", type=float, default=None,
                        help="--nodes --check: GB/s inside a harness node (default: measured there, an alltoallv; the copy rate is always measured)")


#: The inputs the cluster form reads when neither --inputs nor --calibrate is given.
DEFAULT_INPUTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "cost_model_inputs.json"


def run_cluster(args: argparse.Namespace) -> int:
    """The cluster form (``--nodes N``): the table and recommendation for one layout and model."""
    size = model_size(args)
    if size is None:
        return _usage_error("--nodes N needs the model: --params N, --shapes-file JSON or --model NAME")
    if args.check or args.measure:
        return _usage_error("--check and --measure are the tables' options: not with --nodes N")
    if args.calibrate and args.inputs:
        return _usage_error("give --inputs or --calibrate, not both")
    try:
        if args.calibrate:
            from .cost_calibrate import calibrate
            inputs = calibrate(args.repeat)
        else:
            path = args.inputs or DEFAULT_INPUTS
            if not os.path.exists(path):
                raise ValueError(f"no inputs at {path}: give --inputs JSON (bench model --measure) or --calibrate")
            with open(path) as f:
                inputs = Inputs.from_json(json.load(f))
        scaled = scale_inputs(inputs, size[0])
        shapes, powersgd_note = model_shapes(args), ""
        powersgd = None
        if shapes is None:
            powersgd_note = " PowerSGD is not priced: it needs the model's shapes (--shapes-file or --model)."
        elif not inputs.powersgd:
            powersgd_note = " PowerSGD is not priced: the inputs have no PowerSGD figures (--calibrate on a GPU)."
        else:
            from .cost_powersgd import coefficients
            from .shapes import resnet50_shapes
            try:   # the inputs' PowerSGD figures are measured on ResNet-50's shapes
                powersgd = (shapes, coefficients(inputs, resnet50_shapes()))
            except ValueError as exc:
                powersgd_note = f" PowerSGD is not priced: {exc}."
        rows = cluster_rows(scaled, args.nodes, args.per_node, args.inter_gbit, args.intra_gbyte,
                            alpha_s=args.alpha_us * 1e-6, powersgd=powersgd)
        choice = recommend(rows, args.min_speedup)
        fsdp = fsdp_rows(scaled, args.nodes, args.per_node, args.inter_gbit, args.intra_gbyte,
                         alpha_s=args.alpha_us * 1e-6)
    except (ValueError, RuntimeError, OSError, KeyError) as exc:
        print(f"[model] error: {exc}", file=sys.stderr)
        return 2
    header = (f"PREDICTED exchange per step by the cost model (not measured): {args.nodes} nodes x {args.per_node} "
              f"GPUs (K={args.nodes * args.per_node}), {args.inter_gbit:g} Gbit/s per GPU between nodes, "
              f"{args.intra_gbyte:g} GB/s inside a node, alpha {args.alpha_us:g} us; model: {size[1]}.")
    note = (f"Codec times: {scaled.source}. Codec labels: "
            + ", ".join(f"{k} = {n}{'' if not o else ' ' + ','.join(f'{a}={b}' for a, b in o.items())}"
                        for k, (n, o) in cost_model.CODECS.items())
            + ". Compute, overlap with backward and congestion are not included (docs/guide/cost_model.md)."
            + powersgd_note)
    if "on GPU" not in scaled.source:  # the inputs file's figures, or --calibrate on a machine without a GPU
        note += (" These codec times are CPU figures: on GPUs the codec terms are smaller, which favours the "
                 "codecs; run --calibrate on a GPU machine to price them there.")
    text = format_cluster(rows, choice, header, note) + "\n\n" + format_fsdp(fsdp)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# Cost model: PREDICTED exchange on one cluster\n\n" + text + "\n")
    return 0


def _usage_error(message: str) -> int:
    print(f"[model] error: {message}", file=sys.stderr)
    return 2


def run_scaling_check(args: argparse.Namespace) -> int:
    """``--check-scaling``: the size scaling's relative errors, measured here."""
    from .cost_scaling_check import check_scaling, format_scaling
    try:
        whole, rows = check_scaling(repeat=args.repeat)
    except RuntimeError as exc:
        return _usage_error(str(exc))
    errors = [abs(r["rel_error"]) for r in rows if r["rel_error"] is not None]
    print(f"{whole.source}\n\n{format_scaling(rows, whole.numel)}\n\nmean |relative error|: "
          f"{100 * statistics.fmean(errors):.0f}%")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.check_scaling:
        return run_scaling_check(args)
    if args.nodes is not None and args.nodes is not NODES_TABLE:
        return run_cluster(args)
    if args.calibrate or model_size(args) is not None:
        return _usage_error("--calibrate, --params, --shapes-file and --model price a cluster: give --nodes N")
    try:
        if args.measure:
            compute = args.compute_ms if args.compute_ms is not None else compute_only_ms(args)
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
        text += "\n\n" + nodes_table(inputs, per_node=args.per_node, inter_gbit=args.inter_gbit,
                                      intra_gbyte=args.intra_gbyte, alpha_s=args.alpha_us * 1e-6)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write("# Cost model: PREDICTED step times\n\n" + MODEL_DOC + "\n" + text + "\n")
    if args.check and args.nodes:
        try:
            results = run_nodes_check(args, inputs)
        except (ValueError, RuntimeError) as exc:
            print(f"[model] error: {exc}", file=sys.stderr)
            return 2
        if results:
            print(f"harness inside a node (measured): {results[0]['intra_gbyte']} GB/s alltoallv, "
                  f"{results[0]['copy_gbyte']} GB/s copy; link {args.check_rate} between nodes; {args.cores:g} cores")
        print(format_nodes_check(results))
        errors = [abs(c["rel_error"]) for c in results if c["rel_error"] is not None]
        if errors:
            print(f"mean |relative error|: {100 * statistics.fmean(errors):.1f}%")
    elif args.check:
        try:
            results = run_check(args, inputs)
        except (ValueError, RuntimeError) as exc:
            print(f"[model] error: {exc}", file=sys.stderr)
            return 2
        print(format_check(results))
        if results:
            print(f"mean |relative error|: {100 * statistics.fmean(abs(c['rel_error']) for c in results):.1f}%")
    return 0

