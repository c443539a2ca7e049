"""Run a launcher (mpirun, horovodrun, torchrun) under a timeout and read rank 0's JSON line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def env():
    return dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1")


def mpirun(np_: int, *args: str) -> list:
    assert shutil.which("mpirun"), "mpirun not found: run ci/install_system.sh"
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), sys.executable, *args]


def horovodrun_gloo(np_: int, *args: str) -> list:
    return [str(BIN / "horovodrun"), "--gloo", "-np", str(np_), "-H", f"localhost:{np_}", sys.executable, *args]


def torchrun(np_: int, *args: str) -> list:
    return [str(BIN / "torchrun"), "--standalone", "--nproc_per_node", str(np_), *args]


def run(cmd: list, timeout: int) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the repository root; fail the test (with its output) on a timeout or
    a non-zero exit status."""
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} timed out after {timeout}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
    out = f"$ {' '.join(cmd)}\nrc={proc.returncode}\nstdout:\n{proc.stdout[-6000:]}\nstderr:\n{proc.stderr[-6000:]}"
    assert proc.returncode == 0, out
    return proc


def final_json(proc: subprocess.CompletedProcess) -> dict:
    """The JSON object an example prints as the last line of its stdout (asserted to be one)."""
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), f"the last line of stdout is not a JSON object:\n{proc.stdout[-4000:]}"
    return json.loads(lines[-1])


def last_json(proc: subprocess.CompletedProcess) -> dict:
    """The last line of stdout that is a JSON object (launchers may prefix lines with a rank tag)."""
    for line in reversed(proc.stdout.splitlines()):
        brace = line.find("{")
        if brace >= 0:
            try:
                return json.loads(line[brace:])
            except json.JSONDecodeError:
                continue
    raise AssertionError(f"no JSON line in the output:\n{proc.stdout[-4000:]}")
