"""``python -m horovod_gradcomp.bench codecs``: encode/decode speed and wire size of every codec.

What is measured, per (codec, impl):

* one fp32 gradient per parameter of ResNet-50 (161 tensors, 25.6 M values), drawn from a
  standard normal with a fixed seed, on the CPU;
* ``encode_ms``: one pass encoding all tensors in parameter order. Codecs that fuse error
  feedback (``codec.fuses_feedback``) get a residual per tensor, as in training; residuals
  are zeroed before every pass, outside the timed region;
* ``decode_ms``: one pass decoding all the payloads of that encode pass, each into an
  output tensor allocated once outside the timed region (as the Horovod adapter decodes
  into the gradient's own buffer);
* ``bytes``: summed ``payload.nbytes`` (exact wire bytes); ``ratio = 4 * numel / bytes``.

``--device cuda``: the same gradients are moved to the GPU first and every pass is bracketed
by ``torch.cuda.synchronize()``; rows get ``"device": "cuda"`` and a ``copy`` row (impl
``torch``: a device-to-device copy of the same set, ``clone()`` / ``copy_()``) is timed in
the same run as the memory-bandwidth floor to compare the codecs with.

Impl ``twin`` (CPU only) times the device kernels' OpenMP twin (``_C_twin``: the GPU path's
Thrust sources built for the CPU) next to the native CPU kernels; its speed is not the point
(the CPU kernels are the CPU path), it shows the twin is wired in and what it costs. Impl
``twin-bucket`` times the same codec through its bucket ops (``encode_many`` and the bucket decode
of the exchange, over all 161 tensors at once: csrc/device/multi_tensor.cuh), for codecs that have them. Both
twin rows carry ``device_calls``: the device algorithm calls of one encode pass and one decode
pass (what a GPU would launch), tensor by tensor against one bucket, and ``host_syncs``: the
host synchronizations (reads back from the device) of the same passes. The ``twin-bucket`` row
also carries ``bucket_ops``: each op the bucket pass called, in call order, with its device
calls and host synchronizations (``[op, calls, syncs]``), printed one line per codec.

Each figure is the median over ``--repeat`` passes (default 3) after one untimed warm-up
call on the first tensor. The pure-torch reference impl is slow, so it runs
``--reference-repeat`` passes (default: ``min(repeat, 2)``).

Codecs come from the registry (``available_codecs()``), so a newly registered codec shows
up without touching this file. ``--codecs name:key=value`` passes options to
``get_codec``; they are echoed in the row's ``options`` key. The ``fp16`` baseline row
(impl ``torch``: ``tensor.half()`` / ``.float()``, 2 bytes a value) is always there unless
``--codecs`` leaves it out.
"""
from __future__ import annotations

import argparse
import ast
import gc
import json
import statistics
import sys
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from .. import available_codecs, get_codec, native_available, native_cuda_status, native_error, twin_available
from ..native import require_twin
from ..ops import python_name
from ..codecs import Payload
from ..native import NativeUnavailableError
from .shapes import Shape, resnet50_shapes, total_numel

COMMAND = "codecs"
HELP = "encode/decode time and wire bytes of every codec on ResNet-50's gradients"

BASELINE = "fp16"
IMPLS = ("native", "twin", "reference")
REQUIRED_KEYS = ("codec", "impl", "numel", "encode_ms", "decode_ms", "bytes", "ratio")

CodecSpec = Tuple[str, Dict[str, object]]


class _Deterministic:
    """The stand-ins below draw no random numbers: their stream position is nothing to set."""

    def reset_stream(self, position: int) -> None:
        pass


class Fp16Baseline(_Deterministic):
    """Codec-shaped stand-in for "just send fp16": encode is ``half()``, decode ``float()``."""

    name = BASELINE
    impl = "torch"
    fuses_feedback = False

    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Payload:
        """Payload with one fp16 buffer (2 bytes a value); ``residual`` is ignored."""
        return Payload({"half": tensor.half()}, tensor.shape, tensor.dtype, tensor.device)

    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The fp16 values back in the payload's dtype (into ``out`` when given)."""
        half = payload.buffers["half"]
        return half.to(payload.dtype) if out is None else out.copy_(half)


class DeviceCopy(_Deterministic):
    """Codec-shaped "copy the gradient": encode is ``clone()``, decode ``out.copy_()`` (the
    device-to-device copy a codec's passes are compared with)."""

    name = "copy"
    impl = "torch"
    fuses_feedback = False

    def encode(self, tensor: torch.Tensor, residual: Optional[torch.Tensor] = None) -> Payload:
        return Payload({"copy": tensor.clone()}, tensor.shape, tensor.dtype, tensor.device)

    def decode(self, payload: Payload, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        buf = payload.buffers["copy"]
        return buf.clone() if out is None else out.copy_(buf)


# -- inputs ------------------------------------------------------------------------

def make_gradients(shapes: Sequence[Shape], seed: int = 0, device: str = "cpu") -> List[torch.Tensor]:
    """One contiguous fp32 N(0, 1) tensor per shape, identical for a given ``seed`` (drawn on
    the CPU, then moved to ``device``)."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=gen, dtype=torch.float32).to(device) for s in shapes]


def parse_codec_spec(text: str) -> CodecSpec:
    """``"qsgd:bits=4:bucket=512"`` -> ``("qsgd", {"bits": 4, "bucket": 512})``.

    Values are Python literals when they parse as such (ints, floats, True/False), strings
    otherwise."""
    name, *pairs = text.strip().split(":")
    options: Dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"bad codec option {pair!r} in {text!r}: expected key=value")
        try:
            options[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            options[key] = raw
    return name, options


def check_specs(specs: Sequence[CodecSpec]) -> None:
    """Raise ValueError naming what is available when a spec names no known codec."""
    known = {BASELINE, *available_codecs()}
    for name, options in specs:
        if name not in known:
            raise ValueError(f"unknown codec {name!r}; available: {', '.join(sorted(known))}")
        if name == BASELINE and options:
            raise ValueError(f"the {BASELINE} baseline takes no options, got {options}")


def default_specs() -> List[CodecSpec]:
    """The baseline plus every registered codec with its default options."""
    return [(BASELINE, {})] + [(name, {}) for name in available_codecs()]


# -- timing ------------------------------------------------------------------------

def _timed_ms(fn: Callable[[], object], cuda: bool = False) -> Tuple[float, object]:
    """Run ``fn`` once with the garbage collector paused; return (milliseconds, result).
    ``cuda``: the device is synchronized before the start and before the stop."""
    gc.collect()
    gc.disable()
    try:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3, out
    finally:
        gc.enable()


def _encode_all(codec, grads: Sequence[torch.Tensor], residuals: Optional[List[torch.Tensor]]) -> List[Payload]:
    """Encode every gradient, with its residual when ``residuals`` is given. Tensor i draws
    from stream position i (as in the adapter's first step), so every pass and every impl
    quantizes the same way and reports the same bytes."""
    payloads = []
    for i, g in enumerate(grads):
        codec.reset_stream(i)
        payloads.append(codec.encode(g) if residuals is None else codec.encode(g, residual=residuals[i]))
    return payloads


def _warm_up(codec, grad: torch.Tensor) -> None:
    """One untimed encode + decode (first-call costs: lazy init, allocator, caches)."""
    residual = torch.zeros_like(grad) if codec.fuses_feedback else None
    codec.decode(codec.encode(grad, residual=residual))


def _decode_all(codec, payloads: Sequence[Payload], outs: Sequence[torch.Tensor]) -> None:
    """Decode every payload into its preallocated output."""
    for p, o in zip(payloads, outs):
        codec.decode(p, out=o)


def _encode_bucket(codec, grads: Sequence[torch.Tensor], residuals: Optional[List[torch.Tensor]]) -> List[Payload]:
    """:func:`_encode_all` as one bucket (``codec.encode_many``, tensor i from stream position i)."""
    return codec.encode_many(grads, residuals, positions=list(range(len(grads))))


def _decode_bucket(codec, payloads: Sequence[Payload], outs: Sequence[torch.Tensor]) -> None:
    """:func:`_decode_all` as one bucket, through the bucket decode the exchange calls (the mean
    of one rank's payloads: ``decode_mean_list_many`` for variable-size codecs,
    ``decode_mean_stacked_many`` for fixed-size ones)."""
    if codec.variable_size:
        codec.decode_mean_list_many([[p] for p in payloads], outs=outs)
    else:
        stacked = [Payload({k: v.unsqueeze(0) for k, v in p.buffers.items()}, p.shape, p.dtype, p.device)
                   for p in payloads]
        codec.decode_mean_stacked_many(stacked, outs=outs)


def time_codec(codec, grads: Sequence[torch.Tensor], repeat: int, bucket: bool = False) -> Dict[str, float]:
    """Median encode/decode milliseconds over ``repeat`` passes, and the pass's wire bytes.
    ``bucket``: through the codec's bucket ops (all tensors in one call each way).

    Residuals (for ``fuses_feedback`` codecs) are allocated once and zeroed before every
    pass, so every pass encodes the same inputs."""
    residuals = [torch.zeros_like(g) for g in grads] if codec.fuses_feedback else None
    outs = [torch.zeros_like(g) for g in grads]
    cuda = grads[0].is_cuda
    encode, decode = (_encode_bucket, _decode_bucket) if bucket else (_encode_all, _decode_all)
    _warm_up(codec, grads[0])
    enc, dec, nbytes = [], [], 0
    for _ in range(max(1, repeat)):
        if residuals is not None:
            for r in residuals:
                r.zero_()
        ms, payloads = _timed_ms(lambda: encode(codec, grads, residuals), cuda)
        enc.append(ms)
        dec.append(_timed_ms(lambda: decode(codec, payloads, outs), cuda)[0])
        nbytes = sum(p.nbytes for p in payloads)
    return {"encode_ms": statistics.median(enc), "decode_ms": statistics.median(dec), "bytes": nbytes}


def device_calls(codec, grads: Sequence[torch.Tensor], bucket: bool, counter: str = "algorithm_calls") -> List[int]:
    """[encode, decode]: the twin's device algorithm calls (``counter="host_syncs"``: its host
    synchronizations) of one pass over ``grads``."""
    counter = getattr(require_twin(), counter)
    residuals = [torch.zeros_like(g) for g in grads] if codec.fuses_feedback else None
    outs = [torch.zeros_like(g) for g in grads]
    encode, decode = (_encode_bucket, _decode_bucket) if bucket else (_encode_all, _decode_all)
    start = counter()
    payloads = encode(codec, grads, residuals)
    middle = counter()
    decode(codec, payloads, outs)
    return [middle - start, counter() - middle]


def bucket_pass_with(codec, grads: Sequence[torch.Tensor], module, wrap) -> None:
    """One bucket pass of ``codec`` over ``grads`` (``encode_many``, then the bucket decode into
    fresh outputs) with every op of ``module`` replaced by ``wrap(op_name, op)`` for the pass (the
    codecs look their ops up on the module at each call) and restored after it."""
    saved = {python_name(name): getattr(module, python_name(name)) for name in module.ops}
    residuals = [torch.zeros_like(g) for g in grads] if codec.fuses_feedback else None
    outs = [torch.zeros_like(g) for g in grads]
    try:
        for name in module.ops:
            setattr(module, python_name(name), wrap(name, saved[python_name(name)]))
        _decode_bucket(codec, _encode_bucket(codec, grads, residuals), outs)
    finally:
        for attr, fn in saved.items():
            setattr(module, attr, fn)


def bucket_op_counts(codec, grads: Sequence[torch.Tensor]) -> List[list]:
    """``[[op, device calls, host syncs], ...]``: every twin op that one bucket pass over
    ``grads`` (:func:`bucket_pass_with`) calls, in call order, with the device algorithm calls
    and host synchronizations that call made."""
    twin = require_twin()
    counted: List[list] = []

    def counting(name, fn):
        def call(*args, **kwargs):
            calls, syncs = twin.algorithm_calls(), twin.host_syncs()
            try:
                return fn(*args, **kwargs)
            finally:
                counted.append([name, twin.algorithm_calls() - calls, twin.host_syncs() - syncs])
        return call

    bucket_pass_with(codec, grads, twin, counting)
    return counted


def make_row(name: str, impl: str, options: Dict[str, object], numel: int, timing: Dict[str, float]) -> dict:
    """One result row: the required keys, plus ``options`` only when there are any."""
    row = {"codec": name, "impl": impl, "numel": numel,
           "encode_ms": round(timing["encode_ms"], 3), "decode_ms": round(timing["decode_ms"], 3),
           "bytes": int(timing["bytes"]), "ratio": round(4 * numel / timing["bytes"], 3)}
    if options:
        row["options"] = dict(options)
    return row


# -- the run -----------------------------------------------------------------------

def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _usable_impls(impls: Iterable[str], device: str = "cpu") -> List[str]:
    """``impls`` minus ``native`` when the extension did not load, or (``device="cuda"``) has
    no CUDA kernels, minus ``twin`` when the twin did not build (each said loudly on stderr)
    or the gradients are on the GPU (the twin takes CPU tensors)."""
    impls = list(impls)
    for impl in impls:
        if impl not in IMPLS:
            raise ValueError(f"unknown impl {impl!r}; expected one of {', '.join(IMPLS)}")
    if "twin" in impls and device == "cuda":
        _log("note: the twin runs the device kernels on CPU tensors: no 'twin' rows with --device cuda")
        impls.remove("twin")
    if "twin" in impls and not twin_available():
        _log("!" * 78 + "\n!! WARNING: the OpenMP twin of the device kernels (horovod_gradcomp._C_twin) is not "
             "available.\n!! The 'twin' rows are MISSING from these results.\n" + "!" * 78)
        impls.remove("twin")
    if device == "cuda" and "native" in impls and native_available() and not native_available("cuda"):
        _log("!" * 78 + f"\n!! WARNING: {native_cuda_status()[1]}\n!! The 'native' rows are MISSING from "
             "these results; only the slow reference impl was timed.\n" + "!" * 78)
        impls.remove("native")
    if "native" in impls and not native_available():
        _log("!" * 78 + "\n!! WARNING: the native extension horovod_gradcomp._C is not available: "
             f"{native_error()}\n!! The 'native' rows are MISSING from these results; only the "
             "slow reference impl was timed.\n" + "!" * 78)
        impls.remove("native")
    return impls


def _build(name: str, impl: str, options: Dict[str, object]):
    """The codec to time for (name, impl), or None when it cannot be built natively."""
    if name == BASELINE:
        return Fp16Baseline()
    try:
        return get_codec(name, impl=impl, **options)
    except NativeUnavailableError as exc:
        _log(f"!! WARNING: skipping {name}/{impl}: {exc}")
        return None


def run_bench(specs: Optional[Sequence[CodecSpec]] = None, impls: Sequence[str] = IMPLS, repeat: int = 3,
              reference_repeat: Optional[int] = None, limit_tensors: Optional[int] = None,
              seed: int = 0, device: str = "cpu") -> List[dict]:
    """Time every (codec, impl) of ``specs`` (default: baseline + all registered codecs)
    on ResNet-50's gradients (the first ``limit_tensors`` only, when given) and return one
    row per pair; the baseline is timed once, as impl ``torch``."""
    specs = default_specs() if specs is None else list(specs)
    impls = _usable_impls(impls, device)
    shapes = resnet50_shapes()[:limit_tensors] if limit_tensors else resnet50_shapes()
    grads, numel = make_gradients(shapes, seed, device), total_numel(shapes)
    ref_repeat = min(repeat, 2) if reference_repeat is None else reference_repeat
    rows = []
    if device != "cpu":  # the device-to-device copy of the same set, as the floor
        _log(f"timing {DeviceCopy.name}/torch on {len(shapes)} tensors ({device}), {repeat} pass(es)")
        rows.append(make_row(DeviceCopy.name, "torch", {}, numel, time_codec(DeviceCopy(), grads, repeat)))
    for name, options in specs:
        for impl in (["torch"] if name == BASELINE else impls):
            codec = _build(name, impl, options)
            if codec is None:
                continue
            n = ref_repeat if impl == "reference" else repeat
            _log(f"timing {name}/{impl}{' ' + str(options) if options else ''} on {len(shapes)} tensors, "
                 f"{n} pass(es)")
            rows.append(make_row(name, impl, options, numel, time_codec(codec, grads, n)))
            if impl == "twin":
                rows[-1]["device_calls"] = device_calls(codec, grads, bucket=False)
                rows[-1]["host_syncs"] = device_calls(codec, grads, bucket=False, counter="host_syncs")
                if codec.bucket_ops([grads[0].device]):
                    _log(f"timing {name}/twin-bucket on {len(shapes)} tensors as one bucket, {n} pass(es)")
                    rows.append(make_row(name, "twin-bucket", options, numel, time_codec(codec, grads, n, bucket=True)))
                    rows[-1]["device_calls"] = device_calls(codec, grads, bucket=True)
                    rows[-1]["host_syncs"] = device_calls(codec, grads, bucket=True, counter="host_syncs")
                    rows[-1]["bucket_ops"] = bucket_op_counts(codec, grads)
    if device != "cpu":
        for row in rows:
            row["device"] = device
    return rows


SELECTION = "dgc.select"


def selection_rows(density: float = 0.001, repeat: int = 3, impls: Sequence[str] = IMPLS, seed: int = 0,
                   numel: Optional[int] = None, device: str = "cpu") -> List[dict]:
    """DGC's threshold selection alone on ONE flat fp32 tensor of ResNet-50's size
    (25,557,032 values unless ``numel``): native (sampled threshold) against the reference
    (exact ``torch.topk``). Rows are named ``dgc.select``; ``encode_ms`` is the selection
    time, median of ``repeat`` after one warm-up call."""
    n = numel or total_numel(resnet50_shapes())
    flat = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(device)
    cuda = flat.is_cuda
    rows = []
    for impl in _usable_impls(impls, device):
        codec = _build("dgc", impl, {"density": density})
        if codec is None:
            continue
        _log(f"timing {SELECTION}/{impl} density={density} on one tensor of {n:,} values, {repeat} pass(es)")
        codec.select(flat)
        times, picked = [], None
        for _ in range(repeat):
            ms, picked = _timed_ms(lambda: codec.select(flat), cuda)
            times.append(ms)
        nbytes = int(picked[0].numel() * picked[0].element_size() + picked[1].numel() * picked[1].element_size())
        rows.append(make_row(SELECTION, impl, {"density": density}, n,
                             {"encode_ms": statistics.median(times), "decode_ms": 0.0, "bytes": nbytes}))
        if device != "cpu":
            rows[-1]["device"] = device
    return rows


def layout_ratio(codec, shapes: Sequence[Shape], dtype: torch.dtype = torch.float32) -> float:
    """Compression ratio of a fixed-size codec from its layout alone (nothing is encoded):
    ``element_size * numel / sum(codec.payload_nbytes(shape))``."""
    esize = torch.empty((), dtype=dtype).element_size()
    return esize * total_numel(shapes) / sum(codec.payload_nbytes(s, dtype) for s in shapes)


# -- output ------------------------------------------------------------------------

def format_table(rows: Sequence[dict]) -> str:
    """Rows as a left/right aligned text table (numbers right-aligned)."""
    head = ["codec", "impl", "options", "numel", "encode_ms", "decode_ms", "bytes", "ratio"]
    cells = [[r["codec"], r["impl"], ",".join(f"{k}={v}" for k, v in r.get("options", {}).items()) or "-",
              f"{r['numel']:,}", f"{r['encode_ms']:.2f}", f"{r['decode_ms']:.2f}",
              f"{r['bytes']:,}", f"{r['ratio']:.2f}"] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(head)]
    left = 3  # codec, impl, options are text
    def fmt(line):
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths)))
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(c) for c in cells])


def speedup_lines(rows: Sequence[dict]) -> List[str]:
    """One line per codec (and options) timed with both impls: reference over native time,
    encode + decode."""
    by_key: Dict[Tuple[str, str], Dict[str, dict]] = {}
    for r in rows:
        key = (r["codec"], json.dumps(r.get("options", {}), sort_keys=True))
        by_key.setdefault(key, {})[r["impl"]] = r
    lines = []
    for (name, opts), impls in by_key.items():
        label = name if opts == "{}" else f"{name} {opts}"
        if "native" in impls and "reference" in impls:
            ref, nat = (impls[i]["encode_ms"] + impls[i]["decode_ms"] for i in ("reference", "native"))
            lines.append(f"{label}: native vs reference speed-up: {ref / max(nat, 1e-9):.1f}x (encode+decode)")
        if "native" in impls and "twin" in impls:
            twin, nat = (impls[i]["encode_ms"] + impls[i]["decode_ms"] for i in ("twin", "native"))
            lines.append(f"{label}: twin (device kernels on OpenMP) / native CPU kernels: {twin / max(nat, 1e-9):.2f}x "
                         "(encode+decode)")
        if "twin" in impls and "twin-bucket" in impls:
            (e1, d1), (e2, d2) = impls["twin"]["device_calls"], impls["twin-bucket"]["device_calls"]
            lines.append(f"{label}: device algorithm calls per pass (encode + decode): tensor by tensor {e1} + {d1}, "
                         f"as one bucket {e2} + {d2}")
            (e1, d1), (e2, d2) = impls["twin"]["host_syncs"], impls["twin-bucket"]["host_syncs"]
            lines.append(f"{label}: host synchronizations per pass (encode + decode): tensor by tensor {e1} + {d1}, "
                         f"as one bucket {e2} + {d2}")
        if impls.get("twin-bucket", {}).get("bucket_ops"):
            ops = ", ".join(f"{op} {calls}/{syncs}" for op, calls, syncs in impls["twin-bucket"]["bucket_ops"])
            lines.append(f"{label}: per bucket op, device calls / host synchronizations: {ops}")
    return lines


# -- command line ------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of the ``codecs`` subcommand."""
    parser.add_argument("--json", action="store_true", help="print one JSON list of rows on stdout")
    parser.add_argument("--repeat", type=int, default=3, help="timed passes per codec; the median is kept (3)")
    parser.add_argument("--reference-repeat", type=int, default=None,
                        help="timed passes for the slow reference impl (default: min(repeat, 2))")
    parser.add_argument("--codecs", default=None,
                        help="comma-separated codecs, each NAME or NAME:key=value[:key=value] "
                             f"(default: {BASELINE} + all registered)")
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated impls (native,twin,reference)")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (torch.set_num_threads)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the gradients live (cuda: synchronized timings and a device copy row)")
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--no-selection", dest="selection", action="store_false",
                        help=f"skip the {SELECTION} rows (dgc's selection on one 25.6M-value tensor)")
    parser.add_argument("--selection-numel", type=int, default=None, help=argparse.SUPPRESS)
    # Testing aid: time only the first N ResNet-50 tensors.
    parser.add_argument("--limit-tensors", type=int, default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark from parsed arguments; print JSON or a table on stdout."""
    if args.threads:
        torch.set_num_threads(args.threads)
    _log(f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
         f"native extension {'loaded' if native_available() else 'NOT loaded'}")
    impls = [s.strip() for s in args.impls.split(",") if s.strip()]
    device = getattr(args, "device", "cpu")
    specs = None
    try:
        if args.codecs is not None:
            specs = [parse_codec_spec(s) for s in args.codecs.split(",") if s.strip()]
            check_specs(specs)
        bad = [i for i in impls if i not in IMPLS]
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda: torch.cuda.is_available() is False")
        if bad:
            raise ValueError(f"unknown impl(s) {', '.join(bad)}; expected some of {', '.join(IMPLS)}")
    except ValueError as exc:
        _log(f"error: {exc}")
        return 2
    rows = run_bench(specs, impls, args.repeat, args.reference_repeat, args.limit_tensors, args.seed,
                     device)
    if args.selection and any(name == "dgc" for name, _ in (specs or default_specs())):
        rows += selection_rows(repeat=args.repeat, impls=impls, seed=args.seed,
                               numel=args.selection_numel, device=device)
    if args.json:
        print(json.dumps(rows))
    else:
        print(format_table(rows))
        for line in speedup_lines(rows):
            print(line)
    return 0
