"""End-to-end: examples/train.py under ``mpirun -np 2`` with the dense baseline and onebit, the
character LM task (a few steps) and a step made NaN on one rank (skipped on every rank)."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from launchers import final_json, mpirun, run

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
        cmd = mpirun(NP, str(TRAIN), "--codec", codec, "--epochs", str(EPOCHS), "--json", "--no-progress", *extra)
        _results[key] = final_json(run(cmd, RUN_TIMEOUT))
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
