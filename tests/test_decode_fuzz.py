"""Corrupt, truncated and mistyped payloads never crash a decoder (issue 11).

Each test runs ``tests/fuzz_decoders.py`` on one target in a subprocess, so that a segfault
or an abort becomes a test failure naming the case (its seed and number) instead of killing
pytest. The driver feeds every decoder, native and reference, seeded random payloads: valid
ones (which must decode exactly as the reference decoder does), truncated, extended, random
and bit-flipped buffers, corrupt headers and indices, wrong dtypes, dims, strides, K
stacking, buffer names, output tensors and size arguments; it accepts a clean
RuntimeError / ValueError / TypeError (through the codec API, one naming the codec) or an
output of the right shape and dtype. ``HGC_FUZZ_SEED`` picks another seed (default 11);
``HGC_FUZZ_SCALE`` multiplies the case counts.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gradcomp.native import native_available

FUZZ = Path(__file__).with_name("fuzz_decoders.py")
SEED = int(os.environ.get("HGC_FUZZ_SEED", "11"))
SCALE = float(os.environ.get("HGC_FUZZ_SCALE", "1"))

# (target, cases): 4,200 cases in all (about 10,000 decoder calls: a codec case calls decode and
# decode_mean_stacked or decode_mean_list), ~35 s of CPU on the project's 2-core machine.
TARGETS = [("onebit", 600), ("terngrad", 500), ("qsgd_fixed", 500), ("qsgd_elias", 400), ("dgc", 600),
           ("raw", 1000), ("unpack_variable", 600)]


def run_fuzz(target: str, cases: int, impls: str, seed: int = SEED, native_ext: str | None = None,
             env: dict | None = None, timeout: float = 240, extra=()) -> subprocess.CompletedProcess:
    """The driver on one target in a fresh interpreter (its output captured); ``extra``: more
    driver arguments (e.g. ``["--kernels", "twin"]``)."""
    cmd = [sys.executable, str(FUZZ), "--target", target, "--seed", str(seed), "--cases", str(cases),
           "--impls", impls, *extra]
    if native_ext:
        cmd += ["--native-ext", native_ext]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                          cwd=str(FUZZ.parent.parent))


def explain(proc: subprocess.CompletedProcess) -> str:
    """Why a driver run failed: the signal or exit status, the last case started, the findings."""
    lines = proc.stdout.splitlines()
    cases = [ln for ln in lines if ln.startswith("CASE ")]
    rc = proc.returncode
    how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
    fails = "\n".join(ln for ln in lines if ln.startswith("FAIL ") or ln.startswith("  "))[:6000]
    return (f"fuzz driver {how}; last case started: {cases[-1] if cases else '(none)'}\n{fails}\n"
            f"stderr tail:\n{proc.stderr[-3000:]}")


def summary_of(proc: subprocess.CompletedProcess) -> dict:
    last = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    return json.loads(last) if last.startswith("{") else {}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target,cases", TARGETS, ids=[t for t, _ in TARGETS])
def test_decoders_survive_malformed_payloads(target, cases):
    if target == "raw" and not native_available():
        pytest.skip("the native extension is not built: no native entry points to fuzz")
    impls = "native,reference" if native_available() else "reference"
    n = max(1, int(cases * SCALE))
    proc = run_fuzz(target, n, impls)
    summary = summary_of(proc)
    assert proc.returncode == 0 and summary.get("failures") == 0, explain(proc)
    outcomes = summary["outcomes"]
    # The corpus must exercise both sides: payloads that decode and payloads that are refused.
    assert outcomes.get("output", 0) > n // 10, outcomes
    assert sum(v for k, v in outcomes.items() if k != "output") > n // 10, outcomes


def test_driver_reports_a_crash_with_its_case():
    """The harness itself: a process that dies mid-case is reported with the case it was running."""
    code = ("import os, sys; print('CASE target=x seed=5 case=3', flush=True); "
            "os.kill(os.getpid(), 11)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    text = explain(proc)
    assert "SIGSEGV" in text and "seed=5 case=3" in text
    assert summary_of(proc) == {}
