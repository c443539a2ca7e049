"""End-to-end: examples/train.py under ``mpirun -np 2`` with the dense baseline and onebit, the
character LM task (a few steps) and a step made NaN on one rank (skipped on every rank)."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "train.py"
NP = 2
EPOCHS = 10
RUN_TIMEOUT = 240

pytestmark = [
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH"),
    pytest.mark.timeout(2 * RUN_TIMEOUT + 60),
]

_results: dict = {}


def run_train(codec: str, *extra: str) -> dict:
    """Run train.py once per codec and extra arguments (cached); return its JSON summary."""
    key = (codec, *extra)
    if key not in _results:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(NP), sys.executable, str(TRAIN),
               "--codec", codec, "--epochs", str(EPOCHS), "--json", "--no-progress", *extra]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{' '.join(cmd)} timed out after {RUN_TIMEOUT}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")
        out = f"$ {' '.join(cmd)}\nrc={proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-4000:]}"
        assert proc.returncode == 0, out
        lines = proc.stdout.strip().splitlines()
        assert lines and lines[-1].startswith("{"), out
        _results[key] = json.loads(lines[-1])
    return _results[key]


@pytest.mark.parametrize("codec", ["none", "onebit"])
def test_train_converges_with_identical_params(codec):
    r = run_train(codec)
    assert r["codec"] == codec and r["ranks"] == NP and r["epochs"] == EPOCHS
    assert r["params_identical"] is True
    assert r["test_accuracy"] > 0.9, r
    assert r["bytes_dense_per_step"] > 0 and r["bytes_sent_per_step"] > 0
    if codec == "none":
        assert r["wire_ratio"] == pytest.approx(1.0)
    else:
        assert r["wire_ratio"] > 5 and r["payload_ratio"] > 10, r


def test_onebit_matches_dense_accuracy():
    none, onebit = run_train("none"), run_train("onebit")
    assert onebit["bytes_dense_per_step"] == none["bytes_dense_per_step"]
    assert abs(onebit["test_accuracy"] - none["test_accuracy"]) <= 0.03, (none, onebit)


@pytest.mark.parametrize("codec", ["none", "dgc"])
def test_charlm_runs(codec):
    # 1 epoch of a small GRU on every 256th window: about 40 steps per rank.
    r = run_train(codec, "--task", "charlm", "--epochs", "1", "--stride", "256", "--hidden", "32",
                  "--lr", "0.5", "--clip-norm", "0.5")
    assert r["task"] == "charlm" and r["ranks"] == NP and r["params_identical"] is True, r
    assert r["clip_norm"] == 0.5 and r["skipped_steps_per_rank"] == [0] * NP
    assert 0 < r["test_loss"] < 4.0 and r["perplexity"] == pytest.approx(math.exp(r["test_loss"])), r
    assert 0.1 < r["test_accuracy"] < 1, r
    if codec == "dgc":
        assert r["codec_options"]["clip_norm"] == 0.5 and "unit='step'" in r["dgc_schedule"], r


def test_nan_step_is_skipped_on_every_rank():
    r = run_train("onebit", "--epochs", "3", "--nan-at", "5", "--nan-rank", str(NP - 1))
    assert r["nan_at"] == 5 and r["nan_rank"] == NP - 1
    assert r["skipped_steps_per_rank"] == [1] * NP and r["skipped_at"] == [5], r
    assert r["same_skips_on_all_ranks"] is True and r["nonfinite_steps"] == 1, r
    assert r["params_identical"] is True and r["test_accuracy"] > 0.9, r
