"""A rank that stops taking part: the others end with an error naming the step, the bucket and
the ranks they waited for, within the stall timeout plus a few seconds, and mpirun ends."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 3

PROGRAM = f"""
import time, torch
import horovod_gradcomp as hgc
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
comp = hgc.Compression.onebit([("w", torch.nn.Parameter(torch.zeros(100)))], timeout={TIMEOUT_S})
for step in range(5):
    if step == 2 and rank == 1:
        print("rank 1 stalls", flush=True)
        time.sleep(120)
    comp.exchange({{"w": torch.randn(100)}})
print("finished", rank, flush=True)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("np_", [2, 4])
def test_a_stalled_rank_ends_the_job_with_a_clear_error(np_):
    assert shutil.which("mpirun"), "mpirun not found: run ci/install_system.sh"
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(np_), "-x", "OMP_NUM_THREADS=1",
           "-x", "PYTHONPATH", sys.executable, "-c", PROGRAM]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=150)
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the job did not fail:\n{out[-4000:]}"
    assert "rank 1 stalls" in out and "StallError" in out, out[-4000:]
    assert "step 2, bucket all" in out and "waiting for ranks" in out, out[-4000:]
    assert "finished" not in out, out[-4000:]
    # start-up of np_ Python processes on 2 cores, the timeout, then the abort: far below the 120 s sleep
    assert elapsed < 100, f"the job took {elapsed:.0f} s to end"
