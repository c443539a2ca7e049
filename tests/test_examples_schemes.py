"""End-to-end: examples/schemes.py under ``mpirun -np 2`` (briefly) for two asynchronous
schemes, one of them with onebit-encoded pushes (the synchronous ones are checked in
tests/mpi/mpi_schemes.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "schemes.py"
RUN_TIMEOUT = 180

pytestmark = [
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH"),
    pytest.mark.timeout(RUN_TIMEOUT + 30),
]


def run_example(*args: str) -> dict:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS",
           sys.executable, str(SCRIPT), *args, "--epochs", "6", "--json", "--no-progress"]
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} timed out after {RUN_TIMEOUT}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    out = f"$ {' '.join(cmd)}\nrc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
    assert proc.returncode == 0, out
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), out
    return json.loads(lines[-1])


@pytest.mark.parametrize("args", [
    ("--scheme", "easgd-async", "--period", "4", "--codec", "onebit"),
    ("--scheme", "downpour", "--push-every", "2", "--fetch-every", "4"),
])
def test_scheme_example_trains_and_ends_identical(args):
    r = run_example(*args)
    assert r["ranks"] == 2 and r["params_identical"] is True
    assert r["test_accuracy"] > 0.85, r
    assert r["bytes_sent_per_sample"] > 0
    if "--codec" not in args and r["scheme"] != "model-averaging":
        pushes = sum(s["pushes"] for s in r["stats"])
        assert pushes > 0 and sum(sum(s["staleness_histogram"].values()) for s in r["stats"]) == pushes
