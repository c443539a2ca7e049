"""ThreadSanitizer on the OpenMP twin of the device kernels (issues 22 and 32).

A standalone C++ driver (csrc/sanitize/: twin_tsan_driver.cpp and one tsan_<codec>.cpp per codec;
the device sources, no Python, no torch) is built by clang++ with ``-fsanitize=thread`` and LLVM's
libomp, whose Archer tool gives TSan OpenMP's synchronization (g++'s libgomp is not instrumented:
TSan reports false races in Thrust's OpenMP scan there, which is why torch, linked with libgomp,
stays out of this process). tests/tsan_cases.py writes the cases: seeded inputs and the outputs
of the native CPU kernels for them. They cover the per-tensor launchers (onebit, TernGrad, DGC,
QSGD fixed width and Elias encode and decode) and every bucket op of every codec
(csrc/ops/schemas.h's ``*_many``) through the launchers its op calls, in the order and with the
item tables its op builds. The driver runs each case at 1, 2 and 4 OpenMP threads and compares
every output with those bytes. Any TSan report, mismatch or missing output fails. A second run
of the driver with a deliberately racy functor (every index adds into one word) must be reported
by TSan: the harness can fail.

The ops layer itself (csrc/device/<codec>_ops.cpp) is not in the driver: its functions take and
return ``at::Tensor``, so they need libtorch, which brings libgomp into the process, and two
OpenMP runtimes in one process are not supported (and TSan cannot see libgomp's barriers). Below
torch an op does single-threaded host work (argument checks, output allocation, the launchers'
item tables) and then calls the launchers: the driver makes those launcher calls as the ops make
them (tsan_<codec>.cpp names the op each case stands for), so every OpenMP region an op starts
runs under TSan here. The device scans run through csrc/device/scan.cuh's two-level scan on the
twin, so its OpenMP passes are checked here too.

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

from horovod_gradcomp.native import require_native
from tsan_cases import all_cases

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
    sources = sorted((ROOT / "csrc" / "sanitize").glob("*.cpp")) + [ROOT / "csrc" / "device" / "exec.cu"]
    sources += [ROOT / "csrc" / "device" / f"{c}_device.cu" for c in ("onebit", "terngrad", "dgc", "qsgd")]
    cmd = ["clang++", "-std=c++17", "-O1", "-g", "-fopenmp", "-fsanitize=thread", "-DHGC_TWIN",
           "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP", f"-I{_cccl()}", f"-L{lib}", f"-Wl,-rpath,{lib}",
           "-x", "c++", *map(str, sources), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, f"TSan build failed:\n{' '.join(cmd)}\n{proc.stderr[-6000:]}"
    env = dict(os.environ, LD_LIBRARY_PATH=lib, OMP_TOOL_LIBRARIES=os.path.join(lib, "libarcher.so"),
               TSAN_OPTIONS="halt_on_error=0 exitcode=66 report_signal_unsafe=0 ignore_noninstrumented_modules=1")
    return out, env


@pytest.mark.timeout(2400)
def test_twin_under_tsan_equals_the_cpu_kernels_at_1_2_4_threads(driver, tmp_path):
    exe, env = driver
    cases = all_cases(tmp_path / "cases")
    names = [Path(c).name for c in cases]
    missing = [op for op in require_native().ops if op.endswith("_many") and not any(n.startswith(op) for n in names)]
    assert not missing, f"bucket ops without a TSan case (tests/tsan_cases.py): {missing}"
    proc = subprocess.run([str(exe), *cases], capture_output=True, text=True, env=env, timeout=2000)
    bad = "\n".join(ln for ln in proc.stdout.splitlines() if ln.startswith(("MISMATCH", "MISSING")))
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
