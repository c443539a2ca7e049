"""ThreadSanitizer on the OpenMP twin of the device kernels (issue 22).

A standalone C++ driver (csrc/sanitize/twin_tsan_driver.cpp: the device sources, no Python, no
torch) is built by clang++ with ``-fsanitize=thread`` and LLVM's libomp, whose Archer tool gives
TSan OpenMP's synchronization (g++'s libgomp is not instrumented: TSan reports false races in
Thrust's OpenMP scan there, which is why torch, linked with libgomp, stays out of this process).
This test writes the cases: random fp32 inputs and the outputs of the native CPU kernels for
them (onebit encode and decode-sum in both modes, also as bucket ops over five tensors, TernGrad encode and
decode-sum, DGC selection and scatter-sum, QSGD fixed-width encode); the driver runs each at 1, 2 and 4 OpenMP threads and
compares with those bytes. Any TSan report or mismatch fails. A second run of the driver with a
deliberately racy functor (every index adds into one word) must be reported by TSan: the
harness can fail.

Opt-in with the sanitizer runs (``HGC_ASAN=1``, which ``.ci/run`` sets): the build takes a
minute or two on 2 cores.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from horovod_gradcomp.native import require_native

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = os.environ.get("HGC_ASAN") == "1"
pytestmark = pytest.mark.skipif(not OPT_IN, reason="ThreadSanitizer build of the twin: opt-in with HGC_ASAN=1")


def _cccl() -> str:
    import importlib.util

    spec = importlib.util.spec_from_file_location("hgc_setup", ROOT / "setup.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # setup() runs only as __main__
    inc = mod.cccl_include()
    assert inc, "CCCL's headers were not found (CUDA toolkit or nvidia-cuda-cccl)"
    return inc


def _llvm_lib() -> str:
    """The LLVM library directory holding clang's libomp and libarcher."""
    ver = subprocess.run(["clang++", "-dumpversion"], capture_output=True, text=True).stdout.strip().split(".")[0]
    for cand in [f"/usr/lib/llvm-{ver}/lib", *sorted(glob.glob("/usr/lib/llvm-*/lib"))]:
        if os.path.exists(os.path.join(cand, "libarcher.so")) and os.path.exists(os.path.join(cand, "libomp.so")):
            return cand
    raise AssertionError("LLVM's libomp / libarcher not found (Debian: clang libomp-dev; ci/install_system.sh)")


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    assert shutil.which("clang++"), "clang++ not found (ci/install_system.sh installs clang and libomp-dev)"
    lib = _llvm_lib()
    out = tmp_path_factory.mktemp("tsan") / "twin_tsan_driver"
    sources = [ROOT / "csrc" / "sanitize" / "twin_tsan_driver.cpp", ROOT / "csrc" / "device" / "exec.cu"]
    sources += [ROOT / "csrc" / "device" / f"{c}_device.cu" for c in ("onebit", "terngrad", "dgc", "qsgd")
                if (ROOT / "csrc" / "device" / f"{c}_device.cu").exists()]
    cmd = ["clang++", "-std=c++17", "-O1", "-g", "-fopenmp", "-fsanitize=thread", "-DHGC_TWIN",
           "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP", f"-I{_cccl()}", f"-L{lib}", f"-Wl,-rpath,{lib}",
           "-x", "c++", *map(str, sources), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"TSan build failed:\n{' '.join(cmd)}\n{proc.stderr[-6000:]}"
    env = dict(os.environ, LD_LIBRARY_PATH=lib, OMP_TOOL_LIBRARIES=os.path.join(lib, "libarcher.so"),
               TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0 ignore_noninstrumented_modules=1")
    return out, env


def _write(dirpath: Path, op: str, params: dict, inputs: dict, expect: dict) -> str:
    dirpath.mkdir(parents=True)
    (dirpath / "case.txt").write_text(op + "\n" + "".join(f"{k}={v}\n" for k, v in params.items()))
    for name, t in inputs.items():
        (dirpath / name).write_bytes(t.contiguous().view(torch.uint8).numpy().tobytes())
    for name, t in expect.items():
        (dirpath / f"{name}.expect").write_bytes(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return str(dirpath)


def _cases(base: Path) -> list:
    C = require_native()
    gen = torch.Generator().manual_seed(7)
    f32 = torch.float32
    cases = []
    # (rows, cols, rows mode): `cols` below is the kernels' group count (rows mode: the rows)
    for rows, cols, by_rows in ((40, 25, 0), (70001, 1, 0), (13, 296, 0), (40, 25, 1), (13, 2049, 1)):
        n, groups = rows * cols, rows if by_rows else cols
        g = torch.randn(n, generator=gen)
        r = torch.randn(n, generator=gen) * 0.1
        r_cpu = r.clone()
        bits, scales = C.onebit_encode(g, r_cpu, groups, None, bool(by_rows))
        cases.append(_write(base / f"onebit_encode_{n}_{cols}_{by_rows}", "onebit_encode",
                            {"n": n, "cols": groups, "by_rows": by_rows}, {"grad.bin": g, "residual.bin": r},
                            {"bits": bits, "scales": scales, "residual": r_cpu}))
        pays = [C.onebit_encode(torch.randn(n, generator=gen), None, groups, None, bool(by_rows)) for _ in range(3)]
        b3, s3 = torch.stack([p[0] for p in pays]), torch.stack([p[1] for p in pays])
        cases.append(_write(base / f"onebit_decode_{n}_{cols}_{by_rows}", "onebit_decode_sum",
                            {"n": n, "cols": groups, "K": 3, "scale": repr(1 / 3), "by_rows": by_rows},
                            {"bits.bin": b3, "scales.bin": s3},
                            {"out": C.onebit_decode_sum(b3, s3, n, groups, f32, 1 / 3, None, bool(by_rows))}))
    # onebit's bucket ops: a matrix, a one-column tensor, a wide window's shape and two rows-mode
    # tensors per call
    shapes = ((40, 25, 0), (70001, 1, 0), (13, 296, 0), (40, 25, 1), (13, 2049, 1))
    params, ins, expect, dec_ins, dec_expect = {"count": len(shapes)}, {}, {}, {}, {}
    for t, (rows, cols, by_rows) in enumerate(shapes):
        n, groups = rows * cols, rows if by_rows else cols
        params[f"n{t}"], params[f"cols{t}"], params[f"by_rows{t}"] = n, groups, by_rows
        g, r = torch.randn(n, generator=gen), torch.randn(n, generator=gen) * 0.1
        r_cpu = r.clone()
        expect[f"bits{t}"], expect[f"scales{t}"] = C.onebit_encode(g, r_cpu, groups, None, bool(by_rows))
        ins[f"grad{t}.bin"], ins[f"residual{t}.bin"], expect[f"residual{t}"] = g, r, r_cpu
        pays = [C.onebit_encode(torch.randn(n, generator=gen), None, groups, None, bool(by_rows)) for _ in range(3)]
        b3, s3 = torch.stack([p[0] for p in pays]), torch.stack([p[1] for p in pays])
        dec_ins[f"bits{t}.bin"], dec_ins[f"scales{t}.bin"] = b3, s3
        dec_expect[f"out{t}"] = C.onebit_decode_sum(b3, s3, n, groups, f32, 1 / 3, None, bool(by_rows))
    cases.append(_write(base / "onebit_encode_many", "onebit_encode_many", params, ins, expect))
    cases.append(_write(base / "onebit_decode_sum_many", "onebit_decode_sum_many",
                        dict(params, K=3, scale=repr(1 / 3)), dec_ins, dec_expect))
    for n in (1, 33, 100003):
        g = torch.randn(n, generator=gen)
        scale = float(g.abs().max())
        codes, _ = C.terngrad_encode(g, scale, float("inf"), 5, 9)
        cases.append(_write(base / f"terngrad_encode_{n}", "terngrad_encode",
                            {"n": n, "scale": repr(scale), "clip": "inf", "key0": 5, "key1": 9}, {"grad.bin": g},
                            {"codes": codes}))
        c3 = torch.stack([C.terngrad_encode(torch.randn(n, generator=gen), 1.5, float("inf"), k, 1)[0]
                          for k in range(3)])
        s3 = torch.full((3, 1), 1.5)
        cases.append(_write(base / f"terngrad_decode_{n}", "terngrad_decode_sum",
                            {"n": n, "K": 3, "scale": repr(1 / 3)}, {"codes.bin": c3, "scales.bin": s3},
                            {"out": C.terngrad_decode_sum(c3, s3, n, f32, 1 / 3, None)}))
    for n, k, m in ((5000, 50, 500), (200003, 200, 2000), (1000, 10, 0)):
        x = torch.randn(n, generator=gen)
        idx, vals, _, _ = C.dgc_select(x, k, m, 3)
        cases.append(_write(base / f"dgc_select_{n}_{m}", "dgc_select", {"n": n, "k": k, "sample_count": m, "key": 3},
                            {"x.bin": x}, {"idx": idx, "vals": vals}))
        sel = [C.dgc_select(torch.randn(n, generator=gen), k, m, 4 + r)[:2] for r in range(2)]
        ins = {}
        for r, (i, v) in enumerate(sel):
            ins[f"idx{r}.bin"], ins[f"vals{r}.bin"] = i, v
        cases.append(_write(base / f"dgc_scatter_{n}_{m}", "dgc_scatter_sum", {"n": n, "K": 2, "scale": "0.5"}, ins,
                            {"out": C.dgc_scatter_sum([i for i, _ in sel], [v for _, v in sel], n, f32, 0.5, None)}))
    if (ROOT / "csrc" / "device" / "qsgd_device.h").exists():
        for n, s, d, mx in ((100003, 15, 512, 0), (777, 255, 100, 1)):
            x = torch.randn(n, generator=gen)
            norms, packed = C.qsgd_encode_fixed(x, s, d, bool(mx), 11)
            cases.append(_write(base / f"qsgd_fixed_{n}_{s}", "qsgd_encode_fixed",
                                {"n": n, "s": s, "d": d, "max_norm": mx, "key": 11}, {"x.bin": x},
                                {"norms": norms, "packed": packed}))
    return cases


@pytest.mark.timeout(2400)
def test_twin_under_tsan_equals_the_cpu_kernels_at_1_2_4_threads(driver, tmp_path):
    exe, env = driver
    cases = _cases(tmp_path / "cases")
    proc = subprocess.run([str(exe), *cases], capture_output=True, text=True, env=env, timeout=2000)
    bad = "\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith("MISMATCH"))
    report = bad[:4000] + "\n" + proc.stdout[-1000:] + proc.stderr[-8000:]
    assert "WARNING: ThreadSanitizer" not in proc.stderr, f"TSan report:\n{report}"
    assert proc.returncode == 0 and "0 mismatches" in proc.stdout, report
    assert proc.stdout.count("OK ") >= 3 * len(cases), report


@pytest.mark.timeout(600)
def test_tsan_reports_a_racy_functor(driver):
    exe, env = driver
    proc = subprocess.run([str(exe), "--race"], capture_output=True, text=True, env=env, timeout=500)
    assert "WARNING: ThreadSanitizer: data race" in proc.stderr and proc.returncode == 66, (
        f"TSan did not report the deliberate race (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
