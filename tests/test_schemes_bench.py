"""``python -m horovod_gradcomp.bench schemes`` runs (tiny sizes, 2 ranks) and reports a
row per scheme; figures are printed, never asserted."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH"),
              pytest.mark.timeout(300)]


def test_straggler_bench_reports_every_scheme():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "horovod_gradcomp.bench", "schemes", "--np", "2", "--steps", "8", "--width", "32",
           "--sleep-ms", "2", "--schemes", "model_averaging,adag", "--timeout", "240", "--json"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["ranks"] == 2 and set(summary["results"]) == {"model_averaging", "adag"}
    for row in summary["results"].values():
        assert row["others_steps_per_s_even"] > 0 and row["slow_rank_steps_per_s_slowed"] > 0
    assert "others slowed" in proc.stderr
