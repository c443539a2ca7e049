"""``python -m horovod_gradcomp.bench devtime``: each bucket op's device time next to a copy of the
same bytes, and its host synchronizations.

How far is a codec's GPU path from the memory-bandwidth floor? ResNet-50's gradients (161 fp32
tensors, 25.6 M values, 102 MB; ``--limit-tensors`` takes the first N) go through one bucket
pass of every codec with bucket ops (``encode_many``, then the bucket decode of the exchange:
the mean of one rank's payloads), and every device op the pass calls is timed on its own:

* ``--device cuda``: the ops of ``_C`` on CUDA tensors; ``op_ms`` is the stream time between
  two CUDA events recorded around the op's call (kernels, and any time the stream waits for
  the host to launch them); ``copy_ms`` the same for ``dst.copy_(src)`` of the bucket's
  gradient bytes on the same device, the floor a bucket op that reads its input once is
  compared with;
* ``--device twin``: the ops of ``_C_twin`` (the device sources on the CPU's threads) on CPU
  tensors, timed by the host clock (they are synchronous); ``copy_ms`` is a host tensor copy
  of the same bytes. The figures say what the twin costs, not what a GPU would: the twin
  answers the counts (``calls``, ``syncs``), a GPU run answers the times.

Per op the row holds ``calls`` (device algorithm calls, Thrust) and ``syncs`` (host
synchronizations: reads back from the device) of one call, counted by the module
(``algorithm_calls()``/``host_syncs()``; ``None`` when the module has no counters), and
``ratio = op_ms / copy_ms``. Each time is the median over ``--repeat`` passes after one untimed
pass. The ops are wrapped on the module for the pass (the codecs look them up there at each
call) and restored after it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch

from .. import available_codecs, get_codec
from ..native import NativeUnavailableError, kernels_for
from .codecs_bench import bucket_pass_with, check_specs, make_gradients, parse_codec_spec
from .shapes import resnet50_shapes, total_numel

COMMAND = "devtime"
HELP = "each bucket op's device time on ResNet-50's gradients next to a copy of the same bytes, and its host syncs"

DEVICES = ("cuda", "twin")
ROW_KEYS = ("codec", "op", "device", "op_ms", "copy_ms", "ratio", "calls", "syncs", "bytes")


class OpClock:
    """Times one call of a function on ``device`` ("cuda": CUDA events on the current stream;
    "twin": the host clock) and reads the module's counters around it."""

    def __init__(self, device: str, module):
        self.device = device
        self._calls = getattr(module, "algorithm_calls", None)
        self._syncs = getattr(module, "host_syncs", None)

    def _count(self, counter) -> Optional[int]:
        return counter() if counter is not None else None

    def measure(self, fn: Callable[[], object]):
        """(result, pending): ``pending()`` gives (milliseconds, calls, syncs) of the call once
        read (on CUDA it synchronizes on the call's end event)."""
        calls, syncs = self._count(self._calls), self._count(self._syncs)
        if self.device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
        else:
            t0 = time.perf_counter()
            out = fn()
            wall = (time.perf_counter() - t0) * 1e3
        d_calls = None if calls is None else self._calls() - calls
        d_syncs = None if syncs is None else self._syncs() - syncs

        def pending():
            if self.device == "cuda":
                end.synchronize()
                return start.elapsed_time(end), d_calls, d_syncs
            return wall, d_calls, d_syncs
        return out, pending


def copy_ms(grads: Sequence[torch.Tensor], device: str, repeat: int) -> float:
    """Median milliseconds of ``dst.copy_(src)`` of the gradients' bytes as one flat tensor (on
    the GPU for "cuda", on the host for "twin"), after one untimed copy."""
    src = torch.cat([g.reshape(-1) for g in grads])
    dst = torch.empty_like(src)
    clock = OpClock(device, object())
    dst.copy_(src)
    times = []
    for _ in range(max(1, repeat)):
        _, pending = clock.measure(lambda: dst.copy_(src))
        times.append(pending()[0])
    return statistics.median(times)


def bucket_pass_ops(codec, grads: Sequence[torch.Tensor], module, clock: OpClock) -> List[list]:
    """One bucket pass of ``codec`` over ``grads`` with every op of ``module`` timed:
    ``[[op, ms, calls, syncs], ...]`` in call order."""
    pending: List[tuple] = []

    def timed(name, fn):
        def call(*args, **kwargs):
            out, read = clock.measure(lambda: fn(*args, **kwargs))
            pending.append((name, read))
            return out
        return call

    bucket_pass_with(codec, grads, module, timed)
    return [[name, *read()] for name, read in pending]


def codec_rows(name: str, options: Dict[str, object], grads: Sequence[torch.Tensor], device: str, repeat: int,
               floor_ms: float) -> List[dict]:
    """The rows of one codec: one per op of its bucket pass (``[]`` when it has no bucket ops
    on this device, said on stderr)."""
    impl = "native" if device == "cuda" else "twin"
    module = kernels_for(impl, "bench devtime")
    codec = get_codec(name, impl=impl, **options)
    if not codec.bucket_ops([grads[0].device]):
        _log(f"{name}: no bucket ops on {device}: no rows")
        return []
    clock = OpClock(device, module)
    bucket_pass_ops(codec, grads, module, clock)  # warm-up
    passes = [bucket_pass_ops(codec, grads, module, clock) for _ in range(max(1, repeat))]
    nbytes = sum(g.numel() * g.element_size() for g in grads)
    rows = []
    for i, (op, _, calls, syncs) in enumerate(passes[0]):
        ms = statistics.median(p[i][1] for p in passes)
        row = {"codec": name, "op": op, "device": device, "op_ms": round(ms, 6), "copy_ms": round(floor_ms, 6),
               "ratio": round(ms / max(floor_ms, 1e-9), 2), "calls": calls, "syncs": syncs, "bytes": nbytes}
        if options:
            row["options"] = dict(options)
        rows.append(row)
    return rows


#: Variants timed besides every codec's defaults: QSGD's Elias coding has bucket ops of its own
#: (its decode reads each group's stream in one thread: docs/guide/gpu.md, "Not done yet").
EXTRA_SPECS = (("qsgd", {"coding": "elias"}),)


def default_specs() -> List[tuple]:
    """Every registered codec with its defaults, then :data:`EXTRA_SPECS`."""
    return [(name, {}) for name in available_codecs()] + [(n, dict(o)) for n, o in EXTRA_SPECS]


def run_devtime(specs: Optional[Sequence] = None, device: str = "twin", repeat: int = 3,
                limit_tensors: Optional[int] = None, seed: int = 0) -> List[dict]:
    """Every codec of ``specs`` (default: :func:`default_specs`) as rows of
    :func:`codec_rows`, on ResNet-50's gradients (the first ``limit_tensors``)."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: torch.cuda.is_available() is False")
    specs = default_specs() if specs is None else list(specs)
    shapes = resnet50_shapes()[:limit_tensors] if limit_tensors else resnet50_shapes()
    grads = make_gradients(shapes, seed, "cuda" if device == "cuda" else "cpu")
    floor = copy_ms(grads, device, repeat)
    _log(f"copy of the bucket's {total_numel(shapes) * 4:,} bytes ({len(shapes)} tensors) on {device}: {floor:.3f} ms")
    rows: List[dict] = []
    for name, options in specs:
        _log(f"timing {name}{' ' + str(options) if options else ''}: one bucket pass per repeat, {repeat} pass(es)")
        rows += codec_rows(name, options, grads, device, repeat, floor)
    return rows


def _codec_label(row: dict) -> str:
    """The codec of a row with its options: "qsgd coding=elias"."""
    return " ".join([row["codec"], *(f"{k}={v}" for k, v in row.get("options", {}).items())])


def format_table(rows: Sequence[dict]) -> str:
    """Rows as an aligned text table."""
    head = ["codec", "op", "op_ms", "copy_ms", "op/copy", "calls", "syncs"]
    cells = [[_codec_label(r), r["op"], f"{r['op_ms']:.3f}", f"{r['copy_ms']:.3f}", f"{r['ratio']:.2f}",
              "-" if r["calls"] is None else str(r["calls"]), "-" if r["syncs"] is None else str(r["syncs"])]
             for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]

    def fmt(line):
        return "  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``devtime`` subcommand."""
    parser.add_argument("--device", choices=DEVICES, default="twin",
                        help="cuda: _C's CUDA kernels on the GPU; twin: the device sources on the CPU (default)")
    parser.add_argument("--codecs", default=None,
                        help="comma-separated codecs, each NAME or NAME:key=value[:key=value] (default: all "
                             "registered, then qsgd:coding=elias)")
    parser.add_argument("--repeat", type=int, default=3, help="timed bucket passes; the median is kept (3)")
    parser.add_argument("--json", action="store_true", help="print one JSON list of rows on stdout")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    # Testing aid: only the first N ResNet-50 tensors.
    parser.add_argument("--limit-tensors", type=int, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run from parsed arguments; print a table (or JSON) on stdout."""
    try:
        specs = None
        if args.codecs is not None:
            specs = [parse_codec_spec(s) for s in args.codecs.split(",") if s.strip()]
            check_specs(specs)
            if any(name == "fp16" for name, _ in specs):
                raise ValueError("fp16 has no device ops: name codecs with bucket ops")
        rows = run_devtime(specs, args.device, args.repeat, args.limit_tensors, args.seed)
    except (ValueError, NativeUnavailableError) as exc:
        _log(f"error: {exc}")
        return 2
    print(json.dumps(rows) if args.json else format_table(rows))
    return 0
