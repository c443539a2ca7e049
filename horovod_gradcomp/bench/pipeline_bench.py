"""``python -m horovod_gradcomp.bench pipeline``: ms per minibatch of the double-buffered
pipeline (:class:`horovod_gradcomp.training.double_buffering.DoubleBufferedStep`) against its parts.

The model: an MLP of ``--depth`` square ``--width`` x ``--width`` layers (float32, one torch
thread per rank), cross-entropy on random data (a fixed minibatch of ``--batch`` samples
per rank). The compression: ``--codec onebit`` (the default: 1-bit SGD with error
feedback, whose MPI waits use :class:`~horovod_gradcomp.transports.mpi_polling.PollingCommunicator`
with ``--comm polling``, so that the waiting exchange thread does not spin on the core the
forward/backward pass needs) or ``none`` (Horovod's allreduce). Horovod is initialized only
for ``none``: a codec's pipeline does not use it, and its background thread would take CPU
from the measured steps (see ``_World``).

The defaults (3 x 1024 MLP, 3.2 M parameters, 192 samples per rank, onebit, 2 ranks on a
100 Mbit/s loopback) make the two halves' compute and the two onebit exchanges of a
minibatch take comparable times on a 2-core machine; the exchange there is mostly network
time, which a rank with one core can overlap (encoding and decoding cannot).

Figures, each per minibatch (two halves), the median over ``--rounds`` x ``--steps`` timed
minibatches of the slowest rank, after ``--warmup`` untimed ones per round; within a round
the phases run one after another, rounds repeat them (so drift in the machine's load
spreads over all phases):

* ``compute_ms``: the two halves' forward + backward (``torch.autograd.grad``) alone;
* ``exchange_ms``: two ``compression.exchange`` calls of a half's gradient alone;
* ``sequential_ms``: the same steps as the pipeline (halves, delay, two exchanges and two
  updates) with the exchange in the calling thread, nothing overlapped;
* ``pipelined_ms``: the pipeline (exchange of one half during the next half's compute);
* ``full_batch_ms``: the ordinary synchronous step (``double_buffering=False``: one
  gradient of the whole minibatch, one exchange, one update), what the pipeline replaces;
* ``update_ms``: the fixed cost of one update (p.grad + ``optimizer.step()``), from the
  sequential phase; with it the cost rule's prediction (``double_buffering_pays``).

Launching: outside mpirun, the command starts itself under ``mpirun -np --np`` on the
slow-network harness (:mod:`horovod_gradcomp.bench.slownet`; ``--net loopback --rate R``:
every rank's traffic crosses a tbf-limited ``lo``), so that the exchange takes network
time comparable to the compute. Under mpirun it measures in place. Output: a summary on
stderr and, with ``--json``, one JSON object as the last line of stdout.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from . import slownet

COMMAND = "pipeline"
HELP = "ms per minibatch: double-buffered pipeline vs compute, exchange and the sequential steps"
MPI_ENV = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "HOROVOD_RANK")
PHASES = ("compute", "exchange", "sequential", "pipelined", "full_batch")
KEYS = ("compute_ms", "exchange_ms", "sequential_ms", "pipelined_ms")
PARTS = {"encode_s": "encode_ms_per_exchange", "exchange_s": "collective_ms_per_exchange",
         "decode_s": "decode_ms_per_exchange"}


def under_mpi() -> bool:
    """Whether this process was started by an MPI launcher."""
    return any(v in os.environ for v in MPI_ENV)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- measuring (on every rank) ------------------------------------------------------------

class _World:
    """rank, size, barrier() and allgather(obj) for the bench's own bookkeeping: through
    Horovod for ``--codec none`` (which needs it), else through mpi4py alone. Horovod is
    then not initialized at all: its background thread negotiates every cycle and costs an
    idle rank about 30% of a core over TCP, which would compete with the measured steps."""

    def __init__(self, use_horovod: bool):
        if use_horovod:
            import horovod.torch as hvd
            import torch
            if not hvd.is_initialized():
                hvd.init()
            self.rank, self.size = hvd.rank(), hvd.size()
            self.barrier = lambda: hvd.allreduce(torch.zeros(1), name="pipeline_bench.barrier")
            self.allgather = hvd.allgather_object
        else:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD.Dup()
            self.rank, self.size = comm.Get_rank(), comm.Get_size()
            self.barrier = comm.Barrier
            self.allgather = comm.allgather


def _setup(args):
    """(world, model, loss_fn, minibatch, compression) on this rank."""
    import torch
    import torch.nn.functional as F

    import horovod_gradcomp as hgc
    from horovod_gradcomp.transports.mpi_polling import PollingCommunicator

    world = _World(use_horovod=args.codec == "none")
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same model on every rank
    layers = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 10))
    gen = torch.Generator().manual_seed(1 + world.rank)
    minibatch = (torch.randn(args.batch, args.width, generator=gen), torch.randint(0, 10, (args.batch,), generator=gen))

    def loss_fn(x, y):
        return F.cross_entropy(model(x), y)

    if args.codec == "none":
        comp = hgc.Compression.none()
    else:
        comm = PollingCommunicator(args.poll_us * 1e-6) if args.comm == "polling" else None
        comp = hgc.Compression.codec(args.codec, model.named_parameters(), communicator=comm)
    return world, model, loss_fn, minibatch, comp


def _timed(fn: Callable[[], None], n: int, warmup: int, barrier: Callable[[], None]) -> List[float]:
    """Seconds of each of ``n`` calls of ``fn`` after ``warmup`` untimed ones (a barrier first)."""
    for _ in range(warmup):
        fn()
    barrier()
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def measure(args) -> Optional[dict]:
    """Every phase on every rank; the summary dict on rank 0 (None elsewhere)."""
    import torch

    import horovod_gradcomp as hgc
    from horovod_gradcomp.training.double_buffering import predicted_step_s, split_halves

    world, model, loss_fn, minibatch, comp = _setup(args)
    named = list(model.named_parameters())
    params = [p for _, p in named]
    opt = torch.optim.SGD(params, lr=1e-4)

    def compute():
        for half in split_halves(minibatch):
            torch.autograd.grad(loss_fn(*half), params)

    half_grads = dict(zip([n for n, _ in named], torch.autograd.grad(loss_fn(*split_halves(minibatch)[0]), params)))

    def exchange():
        for _ in range(2):
            comp.exchange(half_grads)  # codecs write the mean back into these buffers: same cost

    steppers = {
        "sequential": hgc.DoubleBufferedStep(named, opt, comp, double_buffering=True, overlap=False),
        "pipelined": hgc.DoubleBufferedStep(named, opt, comp, double_buffering=True, overlap=True),
        "full_batch": hgc.DoubleBufferedStep(named, opt, comp, double_buffering=False),
    }
    fns: Dict[str, Callable[[], None]] = {"compute": compute, "exchange": exchange}
    for name, stepper in steppers.items():
        fns[name] = (lambda s: lambda: s.step(loss_fn, minibatch))(stepper)
    times: Dict[str, List[float]] = {p: [] for p in PHASES}
    for _ in range(args.rounds):
        for phase in PHASES:
            times[phase] += _timed(fns[phase], args.steps, args.warmup, world.barrier)
            if phase in steppers:
                steppers[phase].flush()
    stats = {name: s.stats() for name, s in steppers.items()}
    cs = comp.stats()
    per_exchange = {f: cs[f] / cs["steps"] if cs.get("steps") else None for f in ("encode_s", "exchange_s", "decode_s")}
    for s in steppers.values():
        s.close()
    # slowest rank per timed minibatch, then the median
    every = world.allgather({"times": times, "update_s": stats["sequential"]["update_s"] /
                                  max(stats["sequential"]["updates"], 1), "per_exchange": per_exchange})
    if world.rank != 0:
        return None
    ms = {p: 1e3 * statistics.median(max(r["times"][p][i] for r in every) for i in range(len(times[p])))
          for p in PHASES}
    update_ms = 1e3 * max(r["update_s"] for r in every)
    # the cost model takes one exchange (exchange_ms holds two) and a whole minibatch's compute
    off, on = predicted_step_s(ms["compute"], ms["exchange"] / 2, update_ms)
    bound = max(ms["compute"], ms["exchange"])
    numel = sum(p.numel() for p in params)
    return {
        "ranks": world.size, "net": args.net, "rate": args.rate, "codec": args.codec, "comm": args.comm,
        "poll_us": args.poll_us if args.comm == "polling" else None,
        "params": numel, "width": args.width, "depth": args.depth, "batch_per_rank": args.batch,
        "timed_minibatches": args.rounds * args.steps, "torch_threads": torch.get_num_threads(),
        "update_ms": update_ms, "full_batch_ms": ms["full_batch"], "burst": args.burst,
        # one exchange's parts on rank 0 (compression.stats(), mean over all exchanges; codecs only)
        **{PARTS[f]: (1e3 * v if v is not None else None) for f, v in every[0]["per_exchange"].items()},
        "predicted_sequential_ms": ms["compute"] + ms["exchange"] + 2 * update_ms,
        "predicted_full_batch_ms": off, "predicted_pipelined_ms": on,
        "double_buffering_pays": on < off,
        "pipelined_over_max": ms["pipelined"] / bound if bound else None,
        "target_met": bool(ms["pipelined"] <= 1.15 * bound and ms["pipelined"] < ms["sequential"]),
        **{f"{p}_ms": ms[p] for p in ("compute", "exchange", "sequential", "pipelined")},
    }


# -- launching ----------------------------------------------------------------------------

def worker_argv(args: argparse.Namespace, out: str) -> List[str]:
    """The command every rank runs: this bench, measuring in place, writing ``out``."""
    argv = [sys.executable, "-m", "horovod_gradcomp.bench", COMMAND, "--out", out, "--net", args.net]
    for opt in ("codec", "comm", "poll_us", "width", "depth", "batch", "steps", "warmup", "rounds"):
        argv += [f"--{opt.replace('_', '-')}", str(getattr(args, opt))]
    return argv + (["--rate", args.rate, "--burst", args.burst] if args.rate else [])


def launch(args: argparse.Namespace) -> dict:
    """Run the ranks under mpirun on the harness; their summary. RuntimeError on failure."""
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    _log(f"[pipeline] mpirun -np {args.np} on net {args.net}{' at ' + args.rate if args.rate else ''}: "
         f"{args.codec}, {args.rounds} rounds x ({args.warmup} + {args.steps}) minibatches per phase")
    return slownet.run_rows(args.net, args.np, lambda out: worker_argv(args, out), args.rate,
                            label=args.rate or "full speed", timeout=args.timeout, env=env, burst=args.burst)


def format_summary(s: dict) -> str:
    lines = [f"[pipeline] {s['ranks']} ranks, net {s['net']}{' ' + s['rate'] if s['rate'] else ''}, {s['codec']} "
             f"({s['comm']} waits), MLP {s['depth']}x{s['width']} ({s['params']:,} params), "
             f"{s['batch_per_rank']} samples/rank/minibatch, {s['timed_minibatches']} timed minibatches"]
    for key in ("compute_ms", "exchange_ms", "sequential_ms", "pipelined_ms", "full_batch_ms", "update_ms"):
        lines.append(f"  {key:<15}{s[key]:10.1f}")
    lines.append(f"  pipelined / max(compute, exchange) = {s['pipelined_over_max']:.3f} (target <= 1.15); "
                 f"target met: {s['target_met']}")
    lines.append(f"  cost rule: full batch {s['predicted_full_batch_ms']:.1f} ms vs double-buffered "
                 f"{s['predicted_pipelined_ms']:.1f} ms predicted: double buffering pays: {s['double_buffering_pays']}")
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``pipeline`` subcommand."""
    parser.add_argument("--codec", default="onebit", help="onebit (default), any registered codec, or none")
    parser.add_argument("--comm", choices=("polling", "blocking"), default="polling",
                        help="how a codec's exchange waits in MPI (polling: Test + sleep; blocking: MPI's spin)")
    parser.add_argument("--poll-us", type=float, default=1000, help="polling interval of --comm polling (1000 us)")
    parser.add_argument("--width", type=int, default=1024, help="MLP layer width (1024)")
    parser.add_argument("--depth", type=int, default=3, help="square hidden layers (3)")
    parser.add_argument("--batch", type=int, default=192, help="samples per rank and minibatch, even (192)")
    parser.add_argument("--steps", type=int, default=8, help="timed minibatches per phase and round (8)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed minibatches per phase and round (2)")
    parser.add_argument("--rounds", type=int, default=3, help="repetitions of all phases (3)")
    parser.add_argument("--np", type=int, default=2, help="ranks when launching mpirun (2)")
    parser.add_argument("--net", choices=slownet.MODES, default=None,
                        help="network harness when launching (default loopback); under mpirun: a label")
    parser.add_argument("--rate", default=None, help="link rate for loopback/bridge (default 100mbit)")
    parser.add_argument("--burst", default="128kb",
                        help="tbf burst (128kb: above lo's 64 KiB packets, small enough that an idle link banks little)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds allowed for the run (600)")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON object, last")
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)  # set for the ranks by the launcher


def run(args: argparse.Namespace) -> int:
    """Launch or measure (see the module docstring); print the summary (and the JSON)."""
    try:
        if args.batch < 2 or args.batch % 2 or min(args.width, args.depth, args.steps, args.rounds) < 1 \
                or args.warmup < 0:
            raise ValueError("need an even --batch >= 2, --width/--depth/--steps/--rounds >= 1, --warmup >= 0")
        if under_mpi():
            args.net = args.net or "none"
            summary = measure(args)
            if summary is None:
                return 0
            if args.out:
                with open(args.out, "w") as f:
                    json.dump(summary, f)
                return 0
        else:
            args.net = args.net or "loopback"
            if args.net != "none":
                args.rate = args.rate or "100mbit"
                slownet.rate_bits_per_s(args.rate)
            summary = launch(args)
    except (ValueError, RuntimeError, slownet.SlownetUnavailable) as exc:
        _log(f"[pipeline] error: {exc}")
        return 2
    _log(format_summary(summary))
    if args.json:
        print(json.dumps(summary), flush=True)
    return 0
