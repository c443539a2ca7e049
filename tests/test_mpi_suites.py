"""Launch the MPI suites (tests/mpi/mpi_*.py) under mpirun at -np 1, 2 and 4.

Each launch has a timeout; a rank that fails stops its pytest at once (-x), and mpirun then
ends the others, so a failure cannot leave ranks waiting in a collective.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = int(os.environ.get("HGC_MPI_TEST_TIMEOUT", "600"))


def mpirun_command(np_: int, *args: str) -> list[str]:
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_),
            "-x", "OMP_NUM_THREADS=1", "-x", "PYTHONPATH", sys.executable, *args]


@pytest.mark.timeout(TIMEOUT_S + 60)
@pytest.mark.parametrize("np_", [1, 2, 3, 4])
def test_mpi_suite(np_):
    assert shutil.which("mpirun"), "mpirun not found: run ci/install_system.sh (Open MPI is required)"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = mpirun_command(np_, "-m", "pytest", "-x", "-q", "--color=no", "-p", "no:cacheprovider",
                         "-o", "python_files=mpi_*.py", "tests/mpi")
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"mpirun -np {np_} timed out after {TIMEOUT_S}s\n{exc.stdout}\n{exc.stderr}")
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, f"mpirun -np {np_} failed (rc {proc.returncode}):\n{out[-8000:]}"
    # Ranks share one stdout, so two summaries can land on one line: match them anywhere.
    summaries = re.findall(r"\d+ (?:passed|failed|skipped|error)[\w, ]* in [\d.]+s", out)
    assert len(summaries) == np_, f"expected one pytest summary per rank, got {summaries}"
    assert not any("failed" in s or "error" in s for s in summaries), summaries
    assert all("passed" in s for s in summaries), summaries
