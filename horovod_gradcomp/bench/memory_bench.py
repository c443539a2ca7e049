"""``python -m horovod_gradcomp.bench memory``: each codec's extra bytes per rank, as a multiple
of the model's size, measured on the objects themselves after a few real exchanges.

For each config (``onebit``, ``dgc:density=0.001``, ``qsgd:bits=4,pattern=two_phase``, ...;
the syntax of ``bench exchange``) every rank builds the compression for ResNet-50's shapes
(``--shapes small`` for tests), runs ``--steps`` exchanges through ``compression.exchange``
(the same engine and patterns as Horovod's hooks) and then measures, on this rank:

* held between steps: every tensor reachable from the compression object (walked through
  attributes, dicts, lists and tuples), storages counted once, the parameters' own tensors
  left out; split by where it lives: ``residuals`` (error feedback), ``dgc_velocity``,
  ``dgc_accumulation``, ``owner_residuals`` (two-phase), ``other`` (caches);
* allocated per step (the step's peak is at most their sum): the payloads the codec encodes
  (recorded from the results of ``codec.encode`` / ``encode_with_indices`` / ``encode_columns``
  and the owners' exact sums) and the fused send and receive buffers of every
  collective (recorded from the communicator's arguments and results), as the largest step's
  sums of the actual tensors' bytes.

The model's size is the fp32 bytes of its parameters. Runs under any MPI launcher; without
one it launches itself under ``mpirun -np --np`` (plain shared memory). Output: a table,
``--json PATH`` (rows), and the rows are the same on every rank count except the receive
buffers (K payloads) and the owner residuals (1/K of the model each).
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Sequence

from ..transports.interface import COLLECTIVES

COMMAND = "memory"
HELP = "extra bytes per rank of each codec (state, payloads, fused buffers) as a multiple of the model size"

DEFAULT_CONFIGS = ("onebit:pattern=allgather", "onebit:pattern=two_phase", "terngrad:pattern=allgather",
                   "terngrad:pattern=two_phase", "qsgd:bits=4,pattern=allgather", "qsgd:bits=4,pattern=two_phase",
                   "dgc:density=0.001")


def _storage_key(t) -> tuple:
    s = t.untyped_storage()
    return (t.device.type, s.data_ptr(), s.nbytes())


def held_tensors(root, exclude: set) -> Dict[str, int]:
    """Category -> bytes of the tensor storages reachable from ``root`` (each counted once,
    those in ``exclude`` (storage keys) left out). The category is decided by the path:
    error-feedback residuals, DGC's velocities and accumulations, owner residuals, other."""
    import torch
    seen_objs, seen_storages = set(), set(exclude)
    out: Dict[str, int] = {}
    stack = [(root, "")]
    while stack:
        obj, path = stack.pop()
        if id(obj) in seen_objs:
            continue
        seen_objs.add(id(obj))
        if isinstance(obj, torch.Tensor):
            key = _storage_key(obj)
            if key not in seen_storages and key[1] != 0:
                seen_storages.add(key)
                cat = category(path)
                out[cat] = out.get(cat, 0) + key[2]
            continue
        if isinstance(obj, dict):
            stack += [(v, f"{path}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack += [(v, f"{path}[]") for v in obj]
        elif hasattr(obj, "__dict__") and not isinstance(obj, type) and not callable(obj):
            stack += [(v, f"{path}.{k}") for k, v in vars(obj).items()]
    return out


def category(path: str) -> str:
    """Where a tensor found at ``path`` (attribute path from the compression object) belongs."""
    if ".owner_memory." in path:
        return "owner_residuals"
    if ".velocities" in path:
        return "dgc_velocity"
    if ".accumulations" in path:
        return "dgc_accumulation"
    if ".residuals" in path:
        return "residuals"
    return "other"


class _Recorder:
    """Per-step sums of the bytes of payloads encoded and of collective buffers."""

    def __init__(self):
        self.payload = self.buffers = 0
        self.max_payload = self.max_buffers = 0

    def end_step(self):
        self.max_payload = max(self.max_payload, self.payload)
        self.max_buffers = max(self.max_buffers, self.buffers)
        self.payload = self.buffers = 0


def _nbytes(obj) -> int:
    import torch
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(o) for o in obj)
    return 0


def _record_codec(codec, rec: _Recorder) -> None:
    """Add the bytes of every payload ``codec`` encodes (``encode``, ``encode_with_indices``,
    ``encode_columns``, ``encode_stacked``, and those of its two-phase owner-sum codec; a call
    made from inside another counts once) to ``rec``."""
    depth = [0]

    def wrap(fn):
        def recorded(*args, **kwargs):
            depth[0] += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                rec.payload += (out[0] if isinstance(out, tuple) else out).nbytes
            return out
        return recorded
    for name in ("encode", "encode_with_indices", "encode_columns", "encode_stacked"):
        if hasattr(codec, name):
            setattr(codec, name, wrap(getattr(codec, name)))
    make_owner_codec = codec.owner_sum_codec  # two-phase owners' exact sums may come from another codec object

    def owner_sum_codec(k):
        owner = make_owner_codec(k)
        if owner is not None and not getattr(owner, "hgc_memory_recorded", False):
            _record_codec(owner, rec)
            owner.hgc_memory_recorded = True   # recorded once per owner codec object
        return owner
    codec.owner_sum_codec = owner_sum_codec


class _RecordingComm:
    """The communicator, with the bytes of every collective's send and receive buffers recorded."""

    def __init__(self, comm, rec: _Recorder):
        self._comm, self._rec = comm, rec

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name not in COLLECTIVES:
            return attr

        def recorded(*args, **kwargs):
            result = attr(*args, **kwargs)
            self._rec.buffers += _nbytes(args[0]) + _nbytes(result)
            return result
        return recorded

    def polling(self, interval_s: float):
        """The wrapped communicator's polling view (the pipelined chunks' wire thread), recorded too."""
        inner = getattr(self._comm, "polling", None)
        return _RecordingComm(inner(interval_s), self._rec) if inner is not None else self


def measure_config(text: str, shapes, grads, steps: int) -> dict:
    """One rank's measurement of config ``text`` (see the module doc)."""
    import torch
    from .exchange_bench import make_compression, parse_config
    from ..transports.mpi import default_communicator
    cfg = parse_config(text)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in shapes]
    named = [(f"t{i:03d}", p) for i, p in enumerate(params)]
    compression, _ = make_compression(cfg, named)
    rec = _Recorder()
    comm = _RecordingComm(default_communicator(), rec)
    compression.communicator = comm
    _record_codec(compression.codec, rec)
    for _ in range(steps):
        compression.exchange({n: g.clone() for n, g in zip((n for n, _ in named), grads)})
        rec.end_step()
    model = sum(4 * p.numel() for p in params)
    exclude = {_storage_key(p) for p in params}
    held = held_tensors(compression, exclude)
    del compression
    gc.collect()
    return {"config": text, "model_bytes": model, "held": held, "payload_per_step": rec.max_payload,
            "buffers_per_step": rec.max_buffers}


def rows_from(per_rank: List[List[dict]], k: int) -> List[dict]:
    """One row per config: the maximum over ranks of each figure, and as multiples of the model."""
    rows = []
    for j, first in enumerate(per_rank[0]):
        ranks = [r[j] for r in per_rank]
        model = first["model_bytes"]
        cats = sorted({c for r in ranks for c in r["held"]})
        held = {c: max(r["held"].get(c, 0) for r in ranks) for c in cats}
        row = {"config": first["config"], "k": k, "model_bytes": model, "held_bytes": held,
               "held_total_bytes": max(sum(r["held"].values()) for r in ranks),
               "payload_per_step_bytes": max(r["payload_per_step"] for r in ranks),
               "buffers_per_step_bytes": max(r["buffers_per_step"] for r in ranks)}
        row["x_model"] = {c: round(b / model, 4) for c, b in held.items()}
        row["x_model"]["held_total"] = round(row["held_total_bytes"] / model, 4)
        row["x_model"]["payloads_per_step"] = round(row["payload_per_step_bytes"] / model, 4)
        row["x_model"]["buffers_per_step"] = round(row["buffers_per_step_bytes"] / model, 4)
        rows.append(row)
    return rows


def format_table(rows: Sequence[dict]) -> str:
    """Multiples of the model size per config."""
    cols = ["residuals", "dgc_velocity", "dgc_accumulation", "owner_residuals", "other", "held_total",
            "payloads_per_step", "buffers_per_step"]
    head = ["config", "K"] + cols
    cells = [[r["config"], str(r["k"])] + [f"{r['x_model'].get(c, 0.0):.3f}" for c in cols] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    fmt = lambda line: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help="configs as in bench exchange")
    parser.add_argument("--steps", type=int, default=3, help="exchanges before measuring (3)")
    parser.add_argument("--shapes", choices=("resnet50", "small"), default="resnet50")
    parser.add_argument("--np", type=int, default=2, help="ranks when this command launches mpirun (2)")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--json", default=None, metavar="PATH")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from .exchange_bench import parse_config, shapes_named, split_configs, under_mpi
    configs = split_configs(args.configs)
    for c in configs:
        parse_config(c)
    if args.steps < 1:
        print("[memory] error: --steps must be >= 1", file=sys.stderr)
        return 2
    if not under_mpi():
        return _launch(args, configs)
    from mpi4py import MPI
    from .codecs_bench import make_gradients
    comm = MPI.COMM_WORLD
    shapes = shapes_named(args.shapes)
    grads = make_gradients(shapes, seed=1 + comm.Get_rank())
    mine = [measure_config(c, shapes, grads, args.steps) for c in configs]
    every = comm.allgather(mine)
    if comm.Get_rank() != 0:
        return 0
    rows = rows_from(every, comm.Get_size())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if not args.worker:
        print(format_table(rows))
    return 0


def _launch(args: argparse.Namespace, configs: Sequence[str]) -> int:
    from . import slownet
    pkg_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_parent, env.get("PYTHONPATH")) if p)
    with tempfile.TemporaryDirectory(prefix="hgc-memory-") as tmp:
        out = os.path.join(tmp, "rows.json")
        argv = [sys.executable, "-m", "horovod_gradcomp.bench", COMMAND, "--worker", "--configs", ",".join(configs),
                "--steps", str(args.steps), "--shapes", args.shapes, "--json", out]
        try:
            res = slownet.run("none", args.np, argv, timeout=args.timeout, env=env, capture=False)
        except subprocess.TimeoutExpired:
            print(f"[memory] error: the run took over {args.timeout:g} s", file=sys.stderr)
            return 2
        if res.returncode != 0 or not os.path.exists(out):
            print(f"[memory] error: the run failed (rc {res.returncode})", file=sys.stderr)
            return 2
        with open(out) as f:
            rows = json.load(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(format_table(rows))
    return 0
