"""ci/gpu_check.sh selects the tests it means to run (it runs only on a GPU machine, so a wrong
``-k`` would show only there, in minutes nobody gets back).

The steps ``tests`` and ``fuzz`` pick cases of tests/test_cuda_codecs.py by ``-k``. Every id of
that module matches "cuda" (its file name holds it), so a backend is told apart by "twin"
alone: this collects what each expression selects, on this machine, and checks it.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = (ROOT / "ci" / "gpu_check.sh").read_text()


def _k_expression(step: str, backends: str) -> str:
    """The -k expression of a step's pytest call, with $(backend_k) expanded as the script does."""
    line = re.search(rf"^{step}\(\) {{ pytest_q tests/test_cuda_codecs.py -k \"([^\"]*)\"; }}$", SCRIPT, re.M)
    assert line, f"ci/gpu_check.sh: no step {step}() running tests/test_cuda_codecs.py -k \"...\""
    return line.group(1).replace("$(backend_k)", " and not twin" if backends == "cuda" else "")


def _collected(k: str) -> list:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/test_cuda_codecs.py", "-k", k], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return [line for line in out.stdout.splitlines() if line.startswith("tests/")]


def _backend(test_id: str) -> str:
    params = re.search(r"\[([^\]]*)\]$", test_id)
    return params.group(1).split("-")[0] if params else ""


@pytest.mark.parametrize("backends", ["both", "cuda"])
def test_tests_step_leaves_out_the_fuzz_corpus_and_selects_the_backends(backends):
    ids = _collected(_k_expression("tests", backends))
    assert ids and not any("fuzz_corpus" in i for i in ids)
    chosen = {_backend(i) for i in ids if _backend(i) in ("cuda", "twin")}
    assert chosen == ({"cuda"} if backends == "cuda" else {"cuda", "twin"})


def test_fuzz_step_selects_the_cuda_decoders_alone():
    ids = _collected(_k_expression("fuzz", "both"))
    assert ids and all("fuzz_corpus" in i and _backend(i) == "cuda" for i in ids), ids


def test_prebuilt_step_and_limits_are_known_to_the_script():
    assert re.search(r"^prebuilt\(\) {$", SCRIPT, re.M)
    assert "[prebuilt]=" in SCRIPT and "GPU_CHECK_LIMITS" in SCRIPT
    out = subprocess.run(["bash", "-n", str(ROOT / "ci" / "gpu_check.sh")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
