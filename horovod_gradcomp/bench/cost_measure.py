"""The cost model's inputs, measured on this machine (``bench model --measure``), and its check
against the harness (``bench model --check``).

The model itself (:mod:`horovod_gradcomp.bench.cost_model`) only computes; what it is fed comes
from here: the codecs' encode, decode and decode-mean times, PowerSGD's arithmetic, the
in-situ steps at -np 2 and the memory-bandwidth contention factor, each measured as its
docstring says.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Dict, List, Optional, Tuple

from . import exchange_bench as eb
from .cost_powersgd import compressed_matrices
from .cost_model import (CHECK_CONFIGS, CODECS, IN_SITU_CONFIGS, IN_SITU_NP, POWERSGD_RANKS,
                         Inputs, compare, powersgd_factor_bytes)


def decode_mean_ms(name: str, options: dict, k: int, repeat: int = 3, device: str = "cpu",
                   limit_tensors: Optional[int] = None) -> float:
    """Median ms of decoding the mean of ``k`` copies of each ResNet-50 gradient's payload into
    its output (``decode_mean_stacked`` from a [k, n] receive buffer, or ``decode_mean_list`` for
    variable-size codecs), summed over the tensors: what a rank does per step at K = k. The
    gradients live on ``device`` (a CUDA device is synchronized around each pass); with
    ``limit_tensors``, only the first that many of ResNet-50's tensors."""
    import torch
    from .. import get_codec
    from .codecs_bench import make_gradients
    from .shapes import resnet50_shapes
    from ..codecs.base import Payload
    codec = get_codec(name, impl="native", **options)
    shapes = resnet50_shapes()[:limit_tensors] if limit_tensors else resnet50_shapes()
    grads = make_gradients(shapes, device=device)
    cuda = device != "cpu"
    jobs = []
    for i, g in enumerate(grads):
        codec.reset_stream(i)
        p = codec.encode(g)
        if codec.variable_size:
            jobs.append((None, [p] * k, torch.empty_like(g)))
        else:
            stacked = Payload({b: t.reshape(1, -1).expand(k, -1).contiguous() for b, t in p.buffers.items()},
                              p.shape, p.dtype, p.device)
            jobs.append((stacked, None, torch.empty_like(g)))
    times = []
    for _ in range(repeat):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for stacked, plist, out in jobs:
            if stacked is not None:
                codec.decode_mean_stacked(stacked, out=out)
            else:
                codec.decode_mean_list(plist, out=out)
        if cuda:
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def powersgd_compute_ms(shapes, rank: int, repeat: int = 3) -> float:
    """Median ms, on this process's threads, of PowerSGD's arithmetic on ``shapes`` at ``rank``:
    per compressed matrix M (n x m): M += error, P = M Q, orthogonalize P (QR), Q = M^T P,
    M' = P Q^T, error = M - M' (PyTorch's hook, with the allreduces left out)."""
    import torch
    gen = torch.Generator().manual_seed(0)
    mats = [(torch.randn(n, m, generator=gen), torch.zeros(n, m), torch.randn(m, r, generator=gen))
            for n, m, r in compressed_matrices(shapes, rank)]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for grad, error, q in mats:
            m_ = grad + error
            p = m_ @ q
            p, _ = torch.linalg.qr(p)
            q = m_.t() @ p
            approx = p @ q.t()
            torch.sub(m_, approx, out=error)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def measure_inputs(compute_ms: float, repeat: int = 3, in_situ: Optional[Dict[str, float]] = None,
                   contention: Optional[Dict[int, float]] = None,
                   in_situ_cpu: Optional[Dict[str, float]] = None) -> Inputs:
    """Measure the codec and PowerSGD inputs here, on one thread;
    ``compute_ms`` is given (from ``bench exchange --np 1 --configs none``), and so are the
    optional ``in_situ`` steps and their ``in_situ_cpu`` time (:func:`measure_in_situ`) and
    ``contention`` (:func:`measure_contention`)."""
    import torch
    from .codecs_bench import run_bench
    from .shapes import resnet50_shapes, total_numel
    torch.set_num_threads(1)        # one core per rank (also the native kernels' OpenMP threads)
    shapes = resnet50_shapes()
    specs = [("fp16", {})] + list(CODECS.values())
    rows = run_bench(specs, ["native"], repeat)
    by = {}
    for row in rows:
        for key, (name, opts) in CODECS.items():
            if row["codec"] == name and row.get("options", {}) == opts:
                by[key] = {"encode_ms": row["encode_ms"], "decode_ms": row["decode_ms"], "bytes": row["bytes"],
                           "dmean1_ms": decode_mean_ms(name, opts, 1, repeat),
                           "dmean8_ms": decode_mean_ms(name, opts, 8, repeat)}
    fp16 = next({"encode_ms": r["encode_ms"], "decode_ms": r["decode_ms"]} for r in rows if r["codec"] == "fp16")
    psgd = {r: {"compute_ms": powersgd_compute_ms(shapes, r, repeat), "bytes": powersgd_factor_bytes(shapes, r)}
            for r in POWERSGD_RANKS}
    load = os.getloadavg()
    return Inputs(total_numel(shapes), compute_ms, by, fp16, psgd,
                  source=f"measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average "
                         f"{load[0]:.2f}, torch threads {__import__('torch').get_num_threads()}",
                  in_situ=dict(in_situ or {}), contention=dict(contention or {}), in_situ_cpu=dict(in_situ_cpu or {}))


def measure_in_situ(timeout: float, steps: int = 5) -> Tuple[Dict[str, float], Dict[str, float]]:
    """Each method's whole step at -np IN_SITU_NP (``bench exchange --net none``), by method
    label: (wall ms per step, CPU ms one rank took per step)."""
    ns = exchange_args(np=IN_SITU_NP, net="none", rates=None, shapes="resnet50", steps=steps, warmup=2, timeout=timeout)
    rows = [r for r in eb.launch(ns, list(IN_SITU_CONFIGS), [None])
            if r.get("config") in IN_SITU_CONFIGS and "ms_per_step" in r and "skipped" not in r]
    return ({IN_SITU_CONFIGS[r["config"]]: r["ms_per_step"] for r in rows},
            {IN_SITU_CONFIGS[r["config"]]: r["cpu_ms_per_step"] for r in rows if "cpu_ms_per_step" in r})


def _contention_worker(barrier, queue, repeat: int) -> None:
    """One process of :func:`measure_contention`: the median ms of onebit's encode and
    decode of the whole ResNet-50 gradient set plus an SGD-like pass, after the others are ready."""
    import torch
    torch.set_num_threads(1)
    from .. import get_codec
    from .codecs_bench import make_gradients
    from .shapes import resnet50_shapes
    codec = get_codec("onebit", impl="native")
    grads = make_gradients(resnet50_shapes())
    params = [torch.zeros_like(g) for g in grads]

    def step():
        for g, p in zip(grads, params):
            codec.decode(codec.encode(g), out=p)
            p.add_(g, alpha=-1e-9)
    step()
    barrier.wait()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        step()
        times.append(1e3 * (time.perf_counter() - t0))
    queue.put(statistics.median(times))


def measure_contention(max_procs: int, repeat: int = 5) -> Dict[int, float]:
    """procs -> (mean step of ``procs`` processes running at once) / (the step alone), for
    procs = 2 .. ``max_procs``: how much ranks on one machine slow each other down (memory
    bandwidth, shared caches) when each has a core of its own."""
    import multiprocessing as mp
    ctx = mp.get_context("spawn")
    alone = None
    out: Dict[int, float] = {}
    for procs in range(1, max_procs + 1):
        barrier, queue = ctx.Barrier(procs), ctx.Queue()
        workers = [ctx.Process(target=_contention_worker, args=(barrier, queue, repeat)) for _ in range(procs)]
        for w in workers:
            w.start()
        times = [queue.get(timeout=600) for _ in workers]
        for w in workers:
            w.join()
        if procs == 1:
            alone = times[0]
        else:
            out[procs] = round(statistics.fmean(times) / alone, 3)
    return out


def run_check(args, inputs: Inputs) -> List[dict]:
    """Run ``bench exchange`` at each of ``--check-np`` on the loopback harness at 1 Gbit/s and compare."""
    from .shapes import total_numel
    numel = total_numel(eb.shapes_named(args.shapes))
    if numel != inputs.numel:
        raise ValueError(f"the inputs describe a model of {inputs.numel:,} values, --shapes {args.shapes} has "
                         f"{numel:,}: measure the inputs for the shapes checked")
    rows = []
    for np_ in args.check_np:
        ns = exchange_args(np=np_, net="loopback", rates="1gbit", shapes=args.shapes, steps=args.steps,
                           warmup=1, timeout=args.timeout)
        rows += eb.launch(ns, list(CHECK_CONFIGS), ["1gbit"])
    return compare(rows, inputs, args.cores, args.alpha_us * 1e-6)


def exchange_args(**overrides) -> argparse.Namespace:
    """``bench exchange``'s arguments at their defaults, with ``overrides``."""
    parser = argparse.ArgumentParser()
    eb.add_arguments(parser)
    args = parser.parse_args([])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def compute_only_ms(args) -> float:
    """ms per step of ResNet-50 without communication (``bench exchange --np 1 --configs none``):
    the model's ``compute`` input when ``--compute-ms`` is not given."""
    ns = exchange_args(np=1, net="none", rates=None, shapes="resnet50", steps=5, warmup=2, timeout=args.timeout)
    rows = eb.launch(ns, ["none"], [None])
    return rows[0]["ms_per_step"]

