"""End-to-end, short: examples/train_pipeline.py (with and without double buffering) and
examples/onebit_adagrad.py under ``mpirun -np 2``."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_TIMEOUT = 180

pytestmark = [
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH"),
    pytest.mark.timeout(RUN_TIMEOUT + 30),
]


def run_example(script: str, *args: str) -> dict:
    """Run an example under mpirun -np 2; its last line (JSON) as a dict."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "OMP_NUM_THREADS=1",
           sys.executable, f"examples/{script}", "--epochs", "5", "--json", *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    out = f"$ {' '.join(cmd)}\nrc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, out
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pipeline", [False, True])
def test_train_pipeline_learns_with_identical_params(pipeline):
    res = run_example("train_pipeline.py", "--codec", "onebit", *(["--pipeline"] if pipeline else []))
    assert res["params_identical"] and res["pipeline"] == pipeline
    assert res["updates"] == 5 * 22 * (2 if pipeline else 1)
    assert res["test_accuracy"] > 0.85


def test_onebit_adagrad_learns():
    res = run_example("onebit_adagrad.py")
    assert res["params_identical"] and res["optimizer"] == "Adagrad" and res["test_accuracy"] > 0.85
