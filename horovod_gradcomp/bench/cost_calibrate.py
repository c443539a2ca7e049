"""``bench model --calibrate``: the codec inputs of the cost model measured on this machine's device.

The cluster form of ``bench model`` prices the codecs from their encode, decode and decode-mean
times. ``--inputs`` gives times measured earlier (on one CPU core, for the repository's file);
``--calibrate`` measures them here, with the existing timing code (``bench codecs``'s
:func:`~horovod_gradcomp.bench.codecs_bench.run_bench` and
:func:`~horovod_gradcomp.bench.cost_measure.decode_mean_ms`), on the GPU when the native
extension has its CUDA kernels and one is visible, else on one CPU core (as one rank per core
would run them).
"""
from __future__ import annotations

import os
import time
from typing import Optional

from .cost_model import CODECS, POWERSGD_RANKS, Inputs, powersgd_factor_bytes


def calibration_device() -> str:
    """``cuda`` when a GPU is visible and the native extension runs on it, else ``cpu``."""
    import torch
    from .. import native_available
    return "cuda" if torch.cuda.is_available() and native_available("cuda") else "cpu"


def calibrate(repeat: int = 3, device: Optional[str] = None, limit_tensors: Optional[int] = None) -> Inputs:
    """Inputs measured here on ``device`` (default :func:`calibration_device`): per codec of
    :data:`~horovod_gradcomp.bench.cost_model.CODECS` its encode, decode, decode-mean of 1 and
    8 payloads and payload bytes, and the fp16 casts, over ResNet-50's gradients (the first
    ``limit_tensors`` tensors only, when given), and on CPU PowerSGD's arithmetic at ranks 1
    and 4 on the same shapes. No compute or in-situ figure.
    Raises RuntimeError when a codec could not be timed (the native extension is missing)."""
    import torch
    from .codecs_bench import run_bench
    from .cost_measure import decode_mean_ms, powersgd_compute_ms
    from .shapes import resnet50_shapes, total_numel
    device = device or calibration_device()
    if device == "cpu":
        torch.set_num_threads(1)       # one core, as one rank per core would have
    rows = run_bench([("fp16", {})] + list(CODECS.values()), ["native"], repeat, limit_tensors=limit_tensors,
                     device=device)
    codecs = {}
    for key, (name, opts) in CODECS.items():
        row = next((r for r in rows if r["codec"] == name and r["impl"] == "native"
                    and r.get("options", {}) == opts), None)
        if row is None:
            raise RuntimeError(f"--calibrate: {name} could not be timed natively on {device} "
                               "(is the native extension built? see docs/guide/install.md)")
        codecs[key] = {"encode_ms": row["encode_ms"], "decode_ms": row["decode_ms"], "bytes": row["bytes"],
                       "dmean1_ms": decode_mean_ms(name, opts, 1, repeat, device, limit_tensors),
                       "dmean8_ms": decode_mean_ms(name, opts, 8, repeat, device, limit_tensors)}
    fp16 = next({"encode_ms": r["encode_ms"], "decode_ms": r["decode_ms"]} for r in rows if r["codec"] == "fp16")
    shapes = resnet50_shapes()[:limit_tensors] if limit_tensors else resnet50_shapes()
    powersgd = {}
    if device == "cpu":      # its arithmetic is timed on CPU tensors (cost_measure.powersgd_compute_ms)
        powersgd = {r: {"compute_ms": powersgd_compute_ms(shapes, r, repeat), "bytes": powersgd_factor_bytes(shapes, r)}
                    for r in POWERSGD_RANKS}
    where = f"GPU {torch.cuda.get_device_name()}" if device != "cpu" else f"1 CPU core of {os.cpu_count()}"
    return Inputs(total_numel(shapes), 0.0, codecs, fp16, powersgd,
                  source=f"calibrated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {where}, "
                         f"load average {os.getloadavg()[0]:.2f}")
