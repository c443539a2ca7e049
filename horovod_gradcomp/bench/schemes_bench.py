"""``python -m horovod_gradcomp.bench schemes``: does asynchrony survive a straggler?

Every rank trains the same MLP (``--width``, float32, one torch thread, random data) for
``--steps`` local steps under each scheme, twice: with every rank at full speed, then with
the last rank sleeping ``--sleep-ms`` after every step. Printed per scheme: the steps per
second of the other ranks (mean over them, from their first to their last local step,
``finish()`` excluded) and of the slow rank. Synchronous model averaging must fall to the
slow rank's pace; the asynchronous schemes (EASGD, Downpour, ADAG on the sharded center)
should not. On a machine whose cores are shared by the ranks, a sleeping rank frees CPU for
the others, so their pace may even rise: compare within one run only.

``--probe`` instead runs :mod:`horovod_gradcomp.bench.schemes_progress` on 2 ranks: whether
MPI one-sided passive-target accesses and the service thread's pulls complete while the
target rank computes.

Outside mpirun the command starts itself with ``mpirun -np --np`` (loopback TCP);
``--json`` prints one JSON object as the last line.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

COMMAND = "schemes"
HELP = "steps/s of the other ranks with one slow rank: synchronous vs asynchronous schemes"

SCHEMES = ("model_averaging", "easgd_sync", "easgd_async", "downpour", "adag")


def build(kind: str, model, opt, period: int, codec):
    import horovod_gradcomp as hgc
    if kind == "model_averaging":
        return hgc.ModelAveraging(model, opt, period=period, codec=codec)
    if kind == "easgd_sync":
        return hgc.EASGD(model, opt, period=period, alpha=0.1, codec=codec)
    if kind == "easgd_async":
        return hgc.EASGD(model, opt, period=period, alpha=0.1, asynchronous=True, codec=codec)
    if kind == "downpour":
        return hgc.Downpour(model, opt, push_every=period, fetch_every=period, codec=codec)
    if kind == "adag":
        return hgc.ADAG(model, opt, window=period, codec=codec)
    raise ValueError(f"unknown scheme {kind!r}; choose from {', '.join(SCHEMES)}")


def measure(args) -> dict:
    """Under mpirun: {scheme: {"fast": steps/s, "fast_slowed": ..., "slow_rank_slowed": ...}} on rank 0."""
    import torch
    from mpi4py import MPI
    torch.set_num_threads(1)
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    slow = size - 1
    x = torch.randn(args.batch, args.width)
    y = torch.randint(0, 10, (args.batch,))
    out = {}
    for kind in args.schemes.split(","):
        row = {}
        for slowed in (False, True):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
                                        torch.nn.Linear(args.width, 10))
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            trainer = build(kind, model, opt, args.period, None if args.codec == "none" else args.codec)
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                trainer.step()
                if slowed and rank == slow:
                    time.sleep(args.sleep_ms / 1000)
            rate = args.steps / (time.perf_counter() - t0)
            trainer.finish()
            rates = comm.gather(rate, root=0)
            if rank == 0:
                fast = [r for i, r in enumerate(rates) if i != slow] or rates
                key = "slowed" if slowed else "even"
                row[f"others_steps_per_s_{key}"] = sum(fast) / len(fast)
                row[f"slow_rank_steps_per_s_{key}"] = rates[slow]
            comm.Barrier()
        if rank == 0:
            row["others_slowed_over_even"] = row["others_steps_per_s_slowed"] / row["others_steps_per_s_even"]
            out[kind] = row
    return out


def format_table(summary: dict) -> str:
    a = summary["args"]
    lines = [f"[schemes] {summary['ranks']} ranks, MLP width {a['width']}, {a['steps']} steps, period/window "
             f"{a['period']}, codec {a['codec']}, last rank sleeps {a['sleep_ms']} ms per step when slowed",
             f"  {'scheme':<16}{'others even':>12}{'others slowed':>15}{'ratio':>8}{'slow rank':>11}  (steps/s)"]
    for kind, r in summary["results"].items():
        lines.append(f"  {kind:<16}{r['others_steps_per_s_even']:12.1f}{r['others_steps_per_s_slowed']:15.1f}"
                     f"{r['others_slowed_over_even']:8.2f}{r['slow_rank_steps_per_s_slowed']:11.1f}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--np", type=int, default=4, help="ranks when launching (4)")
    parser.add_argument("--steps", type=int, default=200, help="local steps per run (200)")
    parser.add_argument("--period", type=int, default=4, help="averaging period / push window (4)")
    parser.add_argument("--sleep-ms", type=float, default=30.0, help="the slow rank's sleep per step (30)")
    parser.add_argument("--width", type=int, default=256, help="MLP width (256)")
    parser.add_argument("--batch", type=int, default=64, help="samples per step (64)")
    parser.add_argument("--codec", default="none", help="codec of the exchanges (none)")
    parser.add_argument("--schemes", default=",".join(SCHEMES), help="comma-separated subset of " + ",".join(SCHEMES))
    parser.add_argument("--probe", action="store_true", help="run the asynchronous-progress probe instead")
    parser.add_argument("--busy-s", type=float, default=2.0, help="probe: how long the target computes (2)")
    parser.add_argument("--timeout", type=float, default=900, help="mpirun timeout in seconds (900)")
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--in-mpirun", action="store_true", help=argparse.SUPPRESS)


def _launch(args, argv_rest) -> int:
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    np_ = 2 if args.probe else args.np
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "-x", "OMP_NUM_THREADS",
           "-x", "PYTHONPATH", sys.executable, "-m", "horovod_gradcomp.bench", COMMAND, "--in-mpirun", *argv_rest]
    try:
        return subprocess.run(cmd, env=env, timeout=args.timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"[schemes] mpirun took over {args.timeout:g} s (--timeout)", file=sys.stderr)
        return 124


def run(args) -> int:
    if not args.in_mpirun:
        rest = []
        for opt in ("steps", "period", "sleep_ms", "width", "batch", "codec", "schemes", "busy_s"):
            rest += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
        rest += ["--probe"] * args.probe + ["--json"] * args.json
        return _launch(args, rest)
    from mpi4py import MPI
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    if args.probe:
        from .schemes_progress import run_probe
        res = run_probe(busy_s=args.busy_s)
        if rank == 1:
            lines = [f"[schemes probe] target rank computes {args.busy_s:g} s without calling MPI; per access (s):"]
            lines += [f"  {k:<40}" + " ".join(f"{t:7.3f}" for t in v) for k, v in res.items()]
            print("\n".join(lines), file=sys.stderr, flush=True)
            if args.json:
                print(json.dumps({"busy_s": args.busy_s, "access_s": res}), flush=True)
        return 0
    results = measure(args)
    if rank == 0:
        summary = {"ranks": size, "args": {k: getattr(args, k) for k in
                                           ("steps", "period", "sleep_ms", "width", "batch", "codec")},
                   "results": results}
        print(format_table(summary), file=sys.stderr, flush=True)
        if args.json:
            print(json.dumps(summary), flush=True)
    return 0
