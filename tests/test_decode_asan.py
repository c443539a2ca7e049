"""The fuzz corpus against an AddressSanitizer build of the CPU extension (issue 11).

Builds ``csrc/binding.cpp`` + ``csrc/cpu/*.cpp`` once with ``-fsanitize=address
-fno-omit-frame-pointer`` into a temporary directory (never the in-tree ``_C``), then runs a
reduced fuzz corpus (``tests/fuzz_decoders.py``, native decoders only) against that build in
subprocesses started with ``LD_PRELOAD="$(gcc -print-file-name=libasan.so)
$(gcc -print-file-name=libstdc++.so)"`` and ``ASAN_OPTIONS=detect_leaks=0``. Any AddressSanitizer report (an out-of-bounds read or
write, a use after free) fails the test.

The build takes a few minutes on 2 cores (over 15 under a heavily shared machine), so the
test is opt-in: ``HGC_ASAN=1`` (``.ci/run`` sets it, so CI runs it). By hand::

    HGC_ASAN=1 .venv/bin/python -m pytest tests/test_decode_asan.py -q

``HGC_ASAN_BUILD_DIR=/some/dir`` builds there instead of a fresh temporary directory, so a
second run only recompiles what changed (ninja).

It is skipped, with the reason, when the toolchain has no libasan.
"""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_decode_fuzz import explain, run_fuzz, summary_of

ROOT = Path(__file__).resolve().parent.parent
OPT_IN = os.environ.get("HGC_ASAN") == "1"
SEED = int(os.environ.get("HGC_FUZZ_SEED", "11"))
# (target, cases): the reduced corpus, native decoders only.
CORPUS = [("raw", 1500), ("onebit", 300), ("terngrad", 300), ("qsgd_fixed", 300), ("qsgd_elias", 300),
          ("dgc", 300)]

pytestmark = pytest.mark.skipif(not OPT_IN, reason="AddressSanitizer build: opt-in with HGC_ASAN=1 "
                                                   "(1-3 min to compile; .ci/run sets it)")

BUILD = r"""
import glob, os, sys
from torch.utils import cpp_extension
root, out = sys.argv[1], sys.argv[2]
sources = [os.path.join(root, "csrc", "binding.cpp")] + sorted(glob.glob(os.path.join(root, "csrc", "cpu", "*.cpp")))
flags = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer", "-std=c++17", "-fopenmp",
         "-fno-trapping-math", "-ffp-contract=off", "-Wno-c++20-extensions"]
cpp_extension.load(name="_C", sources=sources, build_directory=out, extra_cflags=flags,
                   extra_ldflags=["-fsanitize=address", "-fopenmp"], verbose=False)
"""


def libasan() -> str | None:
    """Path of the compiler's libasan.so, or None when the toolchain has none."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    path = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else None


def libstdcxx() -> str:
    """The compiler's libstdc++.so (preloaded after libasan: the python binary does not link
    it, and ASan's ``__cxa_throw`` interceptor must find the real one at start-up, else the
    first C++ exception - every TORCH_CHECK - dies in "CHECK failed ... real___cxa_throw")."""
    path = subprocess.run(["gcc", "-print-file-name=libstdc++.so"], capture_output=True, text=True).stdout.strip()
    return path if os.path.isabs(path) and os.path.exists(path) else ""


def asan_env(lib: str) -> dict:
    env = dict(os.environ)
    env.update(LD_PRELOAD=f"{lib} {libstdcxx()}".strip(), ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1",
               MAX_JOBS=env.get("MAX_JOBS", "2"), OMP_NUM_THREADS="2")
    return env


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory):
    """(path of the ASan-instrumented extension, the environment to run it in)."""
    lib = libasan()
    if lib is None:
        pytest.skip("the toolchain has no libasan (gcc -print-file-name=libasan.so finds none): "
                    "install the compiler's libasan to run this test")
    out = Path(os.environ["HGC_ASAN_BUILD_DIR"]) if os.environ.get("HGC_ASAN_BUILD_DIR") else \
        tmp_path_factory.mktemp("asan_ext")
    out.mkdir(parents=True, exist_ok=True)
    env = asan_env(lib)
    proc = subprocess.run([sys.executable, "-c", BUILD, str(ROOT), str(out)], capture_output=True, text=True,
                          env=env, timeout=2400)
    assert proc.returncode == 0, f"ASan build failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    built = glob.glob(str(out / "_C*.so"))
    assert len(built) == 1, f"expected one extension in {out}, found {built}"
    data = Path(built[0]).read_bytes()
    assert b"__asan_report_load" in data, "the extension was built without AddressSanitizer instrumentation"
    return built[0], env


@pytest.mark.timeout(3000)
@pytest.mark.parametrize("target,cases", CORPUS, ids=[t for t, _ in CORPUS])
def test_fuzz_corpus_under_asan(asan_build, target, cases):
    ext, env = asan_build
    proc = run_fuzz(target, cases, "native", seed=SEED, native_ext=ext, env=env, timeout=600)
    assert "AddressSanitizer" not in proc.stderr, f"AddressSanitizer report:\n{proc.stderr[-8000:]}\n" + \
        explain(proc)
    summary = summary_of(proc)
    assert proc.returncode == 0 and summary.get("failures") == 0, explain(proc)


def test_asan_catches_an_out_of_bounds_read(tmp_path):
    """The harness can fail: an instrumented library reading one byte past a heap buffer,
    loaded the way the extension is, produces a report and a non-zero exit."""
    if not OPT_IN:
        pytest.skip("opt-in with HGC_ASAN=1")
    lib = libasan()
    if lib is None:
        pytest.skip("the toolchain has no libasan")
    src = tmp_path / "oob.c"
    src.write_text("#include <stdlib.h>\nint oob(int n) { volatile char* p = malloc(n); int v = p[n]; "
                   "free((void*)p); return v; }\n")
    so = tmp_path / "liboob.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-fsanitize=address", "-O0", str(src), "-o", str(so)], check=True)
    code = f"import ctypes, torch; ctypes.CDLL({str(so)!r}).oob(16)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=asan_env(lib),
                          timeout=120)
    assert proc.returncode != 0 and "heap-buffer-overflow" in proc.stderr, proc.stderr[-3000:]
