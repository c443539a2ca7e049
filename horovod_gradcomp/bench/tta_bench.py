"""``python -m horovod_gradcomp.bench tta``: time to accuracy on a small transformer language model.

Trains a decoder-only character transformer (:mod:`.tta_model`, about 1.2 M parameters) on the
examples' text (:mod:`.tta_data`: Python's pydoc topics) at K ranks on the slow-network harness
(:mod:`.slownet`), once per link rate, for every row (:mod:`.tta_rows`: Horovod fp32 and fp16,
DDP's allreduce, DDP PowerSGD rank 1 and 4, and every codec at its defaults through Horovod and
through the DDP hook) with SGD + momentum and with AdamW. Each row records the held-out loss
against training seconds and steps; each gets the time to reach Horovod fp32's final loss +2%
(:mod:`.tta_report`).

Output: a table on stdout; ``--json PATH`` (``{"meta": ..., "rows": [...]}``, each row with its
loss points, ``final_loss``, ``time_to_target_s`` and ``speedup``); ``--plot PREFIX`` (one PNG
per rate, ``PREFIX_<rate>.png``: loss against log seconds and against steps); ``--markdown
PATH`` (the table with the commit, date and machine in one line); ``--readme PAGE`` (the
compact table, one line per row and a column per optimizer and rate, written between the page's
two marker lines: how README.md's results table is made). ``--from-json PATH`` makes the
tables and plots again from a JSON written earlier, without training.

``--quick``: the tiny model, 20 steps, one rate (1 Gbit/s), K=2, SGD, six rows: a check that the
whole path runs (tests/test_bench_tta.py), not a measurement. Options given explicitly override
the preset. The full run (defaults) trains 2 rates x 2 optimizers x 13 rows (4 codecs) for 25
steps: about an hour on a shared 2-core machine (:data:`FULL`); give ``--steps`` more on a larger
one, since 25 steps end well before training does.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional, Tuple

from . import slownet
from .tta_report import add_targets, compact_table, plot, replace_block, table
from .tta_rows import OPTIMIZERS, check_rows

COMMAND = "tta"
HELP = "time to a target loss of a small transformer LM per exchange, on the slow-network harness"

#: The full run, sized to this project's 2-core development machine: 25 steps of every row at both
#: rates took 74 minutes there at a load average of 12 to 34 (docs/guide/time_to_accuracy.md).
FULL = dict(rates="100mbit,1gbit", np=4, net="bridge", rows=None, optimizers="sgd,adamw", size="small", steps=25,
            eval_every=5, batch=16)
QUICK = dict(rates="1gbit", np=2, net="loopback",
             rows="hvd:fp32,hvd:fp16,hvd:onebit,ddp:allreduce,ddp:powersgd1,ddp:onebit", optimizers="sgd",
             size="tiny", steps=20, eval_every=5, batch=16)
ROOT = Path(__file__).resolve().parents[2]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .tta_model import SIZES
    full = FULL
    parser.add_argument("--quick", action="store_true",
                        help="the small check: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    parser.add_argument("--rates", default=None, help=f"comma-separated tc rates ({full['rates']})")
    parser.add_argument("--np", type=_positive_int, default=None, help=f"ranks K ({full['np']})")
    parser.add_argument("--net", choices=slownet.MODES, default=None,
                        help=f"harness layout ({full['net']}: one limited link per rank, as on a switch)")
    parser.add_argument("--rows", default=None, help="comma-separated rows (default: all; bench/tta_rows.py)")
    parser.add_argument("--optimizers", default=None,
                        help=f"comma-separated from {', '.join(OPTIMIZERS)} ({full['optimizers']})")
    parser.add_argument("--size", choices=sorted(SIZES), default=None, help=f"model size ({full['size']})")
    parser.add_argument("--steps", type=_positive_int, default=None, help=f"steps per row ({full['steps']})")
    parser.add_argument("--eval-every", type=_positive_int, default=None,
                        help=f"held-out loss every this many steps ({full['eval_every']})")
    parser.add_argument("--batch", type=_positive_int, default=None,
                        help=f"sequences per rank per step ({full['batch']})")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sgd-lr", type=_positive_float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--adamw-lr", type=_positive_float, default=3e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--powersgd-start", type=_positive_int, default=2,
                        help="PowerSGD's start_powerSGD_iter (2, as bench exchange's DDP rows)")
    parser.add_argument("--warmup-steps", type=int, default=2, help="untimed steps of every row first (2)")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per harness run (3600)")
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--plot", default=None, metavar="PREFIX", help="write PREFIX_<rate>.png per rate")
    parser.add_argument("--markdown", default=None, metavar="PATH")
    parser.add_argument("--from-json", default=None, metavar="PATH", help="report a JSON written earlier; no training")
    parser.add_argument("--readme", default=None, metavar="PAGE",
                        help="rewrite PAGE's generated block (between its two bench tta marker lines) with the "
                             "run's line and the compact table: seconds to the target and speed-up per optimizer "
                             "and rate")


def resolve(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options left unset from the preset (``--quick`` or the full run) and check
    rows and optimizers (ValueError naming the bad one)."""
    import horovod_gradcomp as hgc
    from .tta_rows import all_rows
    preset = QUICK if args.quick else FULL
    for key, value in preset.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    codecs = hgc.available_codecs()
    rows = args.rows.split(",") if args.rows else all_rows(codecs)
    args.rows = ",".join(check_rows([r.strip() for r in rows], codecs))
    bad = [o for o in args.optimizers.split(",") if o not in OPTIMIZERS]
    if bad:
        raise ValueError(f"--optimizers: unknown {bad}; known: {', '.join(OPTIMIZERS)}")
    if args.net == "none":
        args.rates = "unlimited"
    return args


def worker_argv(args: argparse.Namespace, rate: str, out: str) -> List[str]:
    """The command every rank runs for one rate."""
    return [sys.executable, "-m", "horovod_gradcomp.bench.tta_worker", "--rows", args.rows,
            "--optimizers", args.optimizers, "--size", args.size, "--steps", str(args.steps),
            "--eval-every", str(args.eval_every), "--batch", str(args.batch), "--seed", str(args.seed),
            "--sgd-lr", str(args.sgd_lr), "--momentum", str(args.momentum), "--adamw-lr", str(args.adamw_lr),
            "--weight-decay", str(args.weight_decay), "--powersgd-start", str(args.powersgd_start),
            "--warmup-steps", str(args.warmup_steps), "--net", args.net, "--rate", rate, "--json", out]


def launch(args: argparse.Namespace) -> List[dict]:
    """One harness run per rate (:func:`slownet.run`); all rows. RuntimeError when a run fails."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    rows: List[dict] = []
    for rate in args.rates.split(","):
        print(f"[tta] mpirun -np {args.np} on net {args.net} at {rate}: {len(args.rows.split(','))} rows x "
              f"{args.optimizers}, {args.steps} steps each", file=sys.stderr, flush=True)
        rows += slownet.run_rows(args.net, args.np, lambda out: worker_argv(args, rate, out),
                                 None if args.net == "none" else rate, label=rate, timeout=args.timeout, env=env,
                                 hint="; its output is above")
        if args.json:  # the rates done so far, so that a later rate's failure loses no finished one
            save(args, rows, args.json)
    return rows


#: The options a run's JSON records in its ``meta``.
META_KEYS = ("np", "net", "rates", "rows", "optimizers", "size", "steps", "eval_every", "batch", "seed", "sgd_lr",
             "momentum", "adamw_lr", "weight_decay", "powersgd_start", "warmup_steps", "quick")


def save(args: argparse.Namespace, rows: List[dict], path: str) -> dict:
    """Write ``{"meta", "rows"}`` to ``path`` (the rows given targets first); return the meta.
    ``meta["rates"]`` names the rates whose rows are there."""
    meta = {k: getattr(args, k) for k in META_KEYS}
    meta.update(rates=",".join(dict.fromkeys(r["rate"] for r in rows)), params=rows[0]["params"],
                machine=machine_line(getattr(args, "commit", None)))
    add_targets(rows)
    with open(path, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    return meta


def head_commit() -> str:
    """The checkout's short commit hash ("unknown" outside a git checkout)."""
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def machine_line(commit: Optional[str] = None) -> str:
    """Commit (``commit``, else the checkout's now), date, machine and load average in one line."""
    commit = commit or head_commit()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    import torch
    return (f"commit {commit}, {time.strftime('%Y-%m-%d', time.gmtime())}, {cpu} ({os.cpu_count()} cores), "
            f"torch {torch.__version__}, load average {os.getloadavg()[0]:.2f}")


def saved_run(path: str) -> Tuple[dict, List[dict]]:
    """``(meta, rows)`` of a run written by a bench's ``--json`` (what ``--from-json`` reports again)."""
    with open(path) as f:
        data = json.load(f)
    return data["meta"], data["rows"]


def print_report(text: str, markdown: Optional[str], heading: str, command: Optional[str] = None) -> str:
    """Print a bench's report ``text`` and, with ``--markdown``, write it there under ``# heading``
    (after the ``command`` that measured it, in a code block, when given); returns ``text``."""
    print(text)
    if markdown:
        with open(markdown, "w") as f:
            f.write(f"# {heading}\n\n" + (f"```\n{command}\n```\n\n" if command else "") + text)
    return text


def describe(meta: dict) -> str:
    """The run's settings in one sentence."""
    return (f"K={meta['np']} ranks on the {meta['net']} harness, {meta['size']} model ({meta['params']:,} parameters), "
            f"{meta['steps']} steps of {meta['batch']} sequences per rank, held-out loss every {meta['eval_every']} "
            f"steps; SGD lr {meta['sgd_lr']} momentum {meta['momentum']}, AdamW lr {meta['adamw_lr']} weight decay "
            f"{meta['weight_decay']}.")


def readme_block(meta: dict, rows: List[dict]) -> str:
    """What ``--readme`` writes: the run's machine line, its settings, the compact table."""
    return (f"{meta['machine']}. {describe(meta)} Each cell: seconds of training until the held-out loss "
            f"first reached the target (Horovod fp32's final loss + 2%, last line), and the speed-up against "
            f"fp32 in brackets.\n\n{compact_table(rows)}")


def report(meta: dict, rows: List[dict], args: argparse.Namespace) -> str:
    """Targets, the table (stdout and ``--markdown``), the plots (``--plot``); the text."""
    add_targets(rows)
    text = print_report(f"{meta['machine']}\n\n{describe(meta)}\n\n{table(rows)}", args.markdown,
                        "Time to accuracy (measured)")
    if args.readme:
        with open(args.readme) as f:
            page = replace_block(f.read(), readme_block(meta, rows))  # raises before the page is touched
        with open(args.readme, "w") as f:
            f.write(page)
        print(f"[tta] table written into {args.readme}", file=sys.stderr)
    if args.plot:
        for rate in dict.fromkeys(r["rate"] for r in rows):
            path = f"{args.plot}_{rate}.png"
            plot([r for r in rows if r["rate"] == rate], path, f"{rate}: {describe(meta)}")
            print(f"[tta] plot: {path}", file=sys.stderr)
    return text


def run(args: argparse.Namespace) -> int:
    try:
        if args.from_json:
            report(*saved_run(args.from_json), args)
            return 0
        resolve(args)
        args.commit = head_commit()   # the code the run starts from, whatever is committed while it runs
        rows = launch(args)
    except slownet.HARNESS_ERRORS as exc:
        return slownet.error_status("tta", exc)
    if args.json:
        meta = save(args, rows, args.json)
    else:
        meta = {k: getattr(args, k) for k in META_KEYS}
        meta.update(params=rows[0]["params"], machine=machine_line(getattr(args, "commit", None)))
    try:
        report(meta, rows, args)
    except (ValueError, OSError) as exc:
        print(f"[tta] error: {exc}", file=sys.stderr)
        return 2
    return 0
