"""``python -m horovod_gradcomp.bench fsdp-accuracy``: the loss of the FSDP2 example under every codec.

For each optimizer (SGD with momentum, AdamW) trains examples/train_fsdp.py's character transformer
at K ranks (``torchrun`` on gloo, one run per row, the same seed, minibatches and steps in every
row): FSDP2's own dense reduce-scatter, then every codec at its defaults inside the sharded
reduce-scatter (``hgc.fsdp.register``), then (``--ddp-pattern``, ``two_phase`` by default) the same
codec through the DDP hook's pattern (examples/train_lm_ddp.py: the same model, data and steps;
a codec with variable-size payloads, DGC, has no two-phase pattern and runs its allgather there).
Each row records the held-out loss (2,048 windows of the last 10% of the text) and the mean
training loss of the last 20 steps; the table gives each codec's gap to dense FSDP2 and whether the
sharded run is at least as good as the DDP one.

Output: the table on stdout; ``--json PATH`` (``{"meta": ..., "rows": [...]}``, each row the run's
JSON line plus ``path``); ``--markdown PATH`` (the table under the command, the machine and the load
average). ``--from-json PATH`` makes the table again without training.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Optional

COMMAND = "fsdp-accuracy"
HELP = "held-out loss of the FSDP2 example per codec (sharded) against dense FSDP2 and the DDP two-phase hook"
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
#: The gap to dense FSDP2 the issue allows a codec (relative, on the held-out loss).
TOLERANCE = 0.05


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--np", type=int, default=4, help="ranks K (4)")
    parser.add_argument("--optimizers", default="sgd,adamw", help="comma-separated: sgd, adamw (both)")
    parser.add_argument("--codecs", default=None, help="comma-separated codecs (default: every available one)")
    parser.add_argument("--steps", type=int, default=200, help="training steps per row (200)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ddp-pattern", default="two_phase",
                        help="the DDP hook's pattern for the comparison rows (two_phase); 'skip': no DDP rows")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per run (900)")
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--markdown", default=None, metavar="PATH")
    parser.add_argument("--from-json", default=None, metavar="PATH", help="report a JSON written earlier; no training")


def plan(args: argparse.Namespace) -> List[dict]:
    """The runs, in order: per optimizer, dense FSDP2, each codec sharded, each codec on DDP.
    ValueError naming an unknown optimizer or codec."""
    import horovod_gradcomp as hgc
    known = hgc.available_codecs()
    codecs = [c.strip() for c in args.codecs.split(",")] if args.codecs else list(known)
    bad = [c for c in codecs if c not in known]
    if bad:
        raise ValueError(f"--codecs: unknown {bad}; available: {', '.join(known)}")
    optimizers = [o.strip() for o in args.optimizers.split(",")]
    bad = [o for o in optimizers if o not in ("sgd", "adamw")]
    if bad:
        raise ValueError(f"--optimizers: unknown {bad}; known: sgd, adamw")
    if args.np < 2 or args.steps < 20:
        raise ValueError(f"need --np >= 2 and --steps >= 20 (the last-20-steps loss), got {args.np} and {args.steps}")
    runs = []
    for opt in optimizers:
        runs.append({"path": "fsdp", "codec": "none", "optimizer": opt})
        runs += [{"path": "fsdp", "codec": c, "optimizer": opt} for c in codecs]
        if args.ddp_pattern != "skip":
            runs += [{"path": "ddp", "codec": c, "optimizer": opt, "pattern": ddp_pattern(c, args.ddp_pattern)}
                     for c in codecs]
    return runs


def ddp_pattern(codec: str, wanted: str) -> str:
    """``wanted``, or ``allgather`` for a codec whose payloads vary in size (no two-phase pattern)."""
    from ..codecs.registry import codec_class
    variable = codec_class(codec).variable_size
    return "allgather" if wanted == "two_phase" and variable is True else wanted


def run_argv(args: argparse.Namespace, run: dict) -> List[str]:
    """The torchrun command line of one run."""
    script = EXAMPLES / ("train_fsdp.py" if run["path"] == "fsdp" else "train_lm_ddp.py")
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(args.np),
            str(script), "--codec", run["codec"], "--optimizer", run["optimizer"], "--steps", str(args.steps),
            "--seed", str(args.seed), "--json"]
    return argv + (["--pattern", run["pattern"]] if run["path"] == "ddp" else [])


def train(args: argparse.Namespace, run: dict) -> dict:
    """One run's JSON line (RuntimeError with its output's tail when it fails or prints none)."""
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    try:
        proc = subprocess.run(run_argv(args, run), capture_output=True, text=True, timeout=args.timeout, env=env,
                              cwd=str(ROOT))
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{run}: took over {args.timeout:g} s (--timeout)") from None
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stdout + proc.stderr)[-3000:]
        raise RuntimeError(f"{run}: failed (rc {proc.returncode}):\n{tail}")
    out = json.loads(lines[-1])
    out.update(path=run["path"], pattern=run.get("pattern"), load_average=os.getloadavg()[0])
    return out


def table(rows: List[dict]) -> str:
    """One line per (optimizer, codec): the held-out and last-20-steps training losses of the
    sharded run, its gap to dense FSDP2's held-out loss, and the DDP run's held-out loss."""
    out = ["| optimizer | exchange | held-out loss | train loss (last 20) | vs dense FSDP2 | within 5% "
           "| DDP hook held-out (pattern) | sharded <= DDP |",
           "|---|---|---:|---:|---:|---|---:|---|"]
    for opt in dict.fromkeys(r["optimizer"] for r in rows):
        mine = [r for r in rows if r["optimizer"] == opt]
        dense = next((r for r in mine if r["path"] == "fsdp" and r["codec"] == "none"), None)
        for r in (r for r in mine if r["path"] == "fsdp"):
            name = "FSDP2 dense (fp32 reduce-scatter)" if r["codec"] == "none" else f"{r['codec']} (sharded)"
            if not r["finite"]:
                out.append(f"| {opt} | {name} | diverged | - | - | no | - | - |")
                continue
            gap = within = ddp_text = better = "-"
            if dense is not None and r is not dense:
                rel = r["test_loss"] / dense["test_loss"] - 1
                gap, within = f"{100 * rel:+.1f}%", "yes" if rel <= TOLERANCE else "no"
            ddp = next((d for d in mine if d["path"] == "ddp" and d["codec"] == r["codec"]), None)
            if ddp is not None:
                ddp_text = (f"{ddp['test_loss']:.3f}" if ddp["finite"] else "diverged") + f" ({ddp['pattern']})"
                better = "yes" if not ddp["finite"] or r["test_loss"] <= ddp["test_loss"] else \
                    f"no ({100 * (r['test_loss'] / ddp['test_loss'] - 1):+.1f}%)"
            out.append(f"| {opt} | {name} | {r['test_loss']:.3f} | {r['last_loss']:.3f} | {gap} | {within} "
                       f"| {ddp_text} | {better} |")
    return "\n".join(out)


def report(meta: dict, rows: List[dict], markdown: Optional[str]) -> str:
    from .tta_bench import print_report
    text = (f"{meta['machine']}\n\nK = {meta['np']} processes (torchrun, gloo), {meta['steps']} steps of 32 windows "
            f"per rank, seed {meta['seed']}; {rows[0]['parameters']:,} parameters. Load average during the runs: "
            f"{min(r['load_average'] for r in rows):.2f} to {max(r['load_average'] for r in rows):.2f}.\n\n"
            f"{table(rows)}\n")
    return print_report(text, markdown, f"FSDP2 accuracy at K = {meta['np']} (measured)", meta["command"])


def run(args: argparse.Namespace) -> int:
    """Train every row (a row that fails is recorded with its error and the others still run; the
    JSON is rewritten after each row), then report. Exit status 1 when a row failed."""
    from .tta_bench import machine_line, saved_run
    try:
        if args.from_json:
            report(*saved_run(args.from_json), args.markdown)
            return 0
        runs = plan(args)
    except (ValueError, OSError, KeyError) as exc:
        print(f"[fsdp-accuracy] error: {exc}", file=sys.stderr)
        return 2
    meta = {"np": args.np, "steps": args.steps, "seed": args.seed, "ddp_pattern": args.ddp_pattern,
            "machine": machine_line(), "command": "python -m horovod_gradcomp.bench " + " ".join(sys.argv[1:])}
    rows, failed = [], []
    for i, r in enumerate(runs):
        t0 = time.perf_counter()
        try:
            rows.append(train(args, r))
            done = f"held-out {rows[-1]['test_loss']:.3f}"
        except RuntimeError as exc:
            failed.append(dict(r, error=str(exc)[-3000:]))
            done = f"FAILED: {str(exc)[-1500:]}"
        print(f"[fsdp-accuracy] {i + 1}/{len(runs)} {r['optimizer']} {r['path']} {r['codec']}: {done} "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"meta": meta, "rows": rows, "failed": failed}, f, indent=1)
    if rows:
        report(meta, rows, args.markdown)
    return 1 if failed else 0
