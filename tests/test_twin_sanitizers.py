"""The OpenMP twin of the device kernels under AddressSanitizer (issue 22).

Builds the whole twin (``ci/build_twin_dev.py --sanitize address``: every csrc/twin/*.cpp, the
twin's own flags plus ``-fsanitize=address``) into a temporary directory, then runs against it,
in subprocesses with libasan preloaded (as tests/test_decode_asan.py does for the CPU kernels):

* the raw fuzz corpus decoded by the twin (``fuzz_decoders.py --target raw --kernels twin``);
* the device suite's twin cases (tests/test_cuda_codecs.py: encodes, decodes, decode-sums,
  malformed payloads), the 2^20-value size and the ResNet-50 shape sweeps left out for time.

Any AddressSanitizer report fails. Opt-in like the CPU ASan test (``HGC_ASAN=1``; ``.ci/run``
sets it): the instrumented build takes minutes on 2 cores.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_decode_asan import OPT_IN, asan_env, libasan
from test_decode_fuzz import explain, run_fuzz, summary_of

ROOT = Path(__file__).resolve().parent.parent
SEED = int(os.environ.get("HGC_FUZZ_SEED", "11"))

pytestmark = pytest.mark.skipif(not OPT_IN, reason="AddressSanitizer build of the twin: opt-in with HGC_ASAN=1")


@pytest.fixture(scope="module")
def twin_asan(tmp_path_factory):
    """(path of the ASan-instrumented twin, the environment to run it in)."""
    lib = libasan()
    if lib is None:
        pytest.skip("the toolchain has no libasan (gcc -print-file-name=libasan.so finds none)")
    out = Path(os.environ["HGC_TWIN_ASAN_BUILD_DIR"]) if os.environ.get("HGC_TWIN_ASAN_BUILD_DIR") else \
        tmp_path_factory.mktemp("twin_asan")
    env = asan_env(lib)
    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "build_twin_dev.py"), "--build-dir", str(out),
                           "--sanitize", "address"], capture_output=True, text=True, env=env, timeout=3000)
    assert proc.returncode == 0, f"ASan build of the twin failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    so = out / "_C_twin.so"
    assert so.exists(), f"no {so}"
    assert b"__asan_report_load" in so.read_bytes(), "the twin was built without AddressSanitizer instrumentation"
    env = dict(env, HGC_TWIN_PATH=str(so))
    return str(so), env


@pytest.mark.timeout(1200)
def test_twin_fuzz_corpus_under_asan(twin_asan):
    _, env = twin_asan
    proc = run_fuzz("raw", 1500, "native", seed=SEED, env=env, timeout=1100, extra=["--kernels", "twin"])
    assert "AddressSanitizer" not in proc.stderr, f"AddressSanitizer report:\n{proc.stderr[-8000:]}\n" + explain(proc)
    summary = summary_of(proc)
    assert proc.returncode == 0 and summary.get("failures") == 0, explain(proc)


@pytest.mark.timeout(2400)
def test_twin_device_suite_under_asan(twin_asan):
    _, env = twin_asan
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "--color=no", "-p", "no:cacheprovider",
                           str(ROOT / "tests" / "test_cuda_codecs.py"), "-k", "twin and not 1048579 and not fuzz_corpus and not resnet50"],
                          capture_output=True, text=True, env=env, timeout=2300, cwd=str(ROOT))
    out = proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "AddressSanitizer" not in proc.stdout + proc.stderr, f"AddressSanitizer report:\n{out}"
    assert proc.returncode == 0 and " passed" in proc.stdout, out
