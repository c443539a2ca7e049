"""examples/onebit_sim.py: K ranks in one process model train.py's charlm run under mpirun.

The dense case must land on train.py's own result (same shards, batches, initialization and
SGD; only the summation order of the mean differs), so that the simulator's onebit figures in
docs/results/onebit_divergence.md stand for the real exchange's."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from launchers import final_json, mpirun, run

ROOT = Path(__file__).resolve().parents[1]
SIM = ROOT / "examples" / "onebit_sim.py"
TRAIN = ROOT / "examples" / "train.py"
SMALL = ["--epochs", "1", "--stride", "256", "--hidden", "32"]  # about 40 steps per rank
RUN_TIMEOUT = 240

pytestmark = pytest.mark.timeout(2 * RUN_TIMEOUT + 60)


def sim(*args: str) -> dict:
    out = run([sys.executable, str(SIM), *SMALL, *args], RUN_TIMEOUT)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")
def test_dense_simulation_lands_on_train_py():
    mine = sim("--ranks", "2", "--codec", "none")
    real = final_json(run(mpirun(2, str(TRAIN), "--task", "charlm", "--codec", "none", "--json", "--no-progress",
                                 *SMALL), RUN_TIMEOUT))
    assert mine["steps_per_epoch"] == real["steps_per_epoch"]
    assert mine["test_loss"] == pytest.approx(real["test_loss"], rel=1e-3), (mine, real)


def test_onebit_simulation_runs_with_its_options():
    r = sim("--ranks", "3", "--scales", "rows", "--lr-warmup-steps", "10", "--warmup-steps", "2")
    assert (r["ranks"], r["scales"], r["lr_warmup_steps"], r["warmup_steps"]) == (3, "rows", 10, 2)
    assert 0 < r["test_loss"] < 4.6, r


def test_remedy_and_schedule_options_reach_the_run(tmp_path):
    """--residual-cap is the codec's option (the run differs from the uncapped one), --optimizer-warmup
    the script's schedule; --log appends the result."""
    log = tmp_path / "runs.jsonl"
    common = ("--ranks", "2", "--scales", "rows", "--optimizer-warmup", "20", "--impl", "reference")
    r = sim(*common, "--residual-cap", "0.5", "--log", str(log))
    assert (r["residual_cap"], r["cap_groups"], r["optimizer_warmup"], r["diverged"]) == (0.5, "codec", 20, False)
    assert 0 < r["test_loss"] < 4.6, r
    assert json.loads(log.read_text().splitlines()[-1]) == r
    assert sim(*common)["test_loss"] != r["test_loss"]


def test_a_diverging_run_stops_early():
    r = sim("--ranks", "2", "--codec", "none", "--lr", "1000", "--epochs", "3", "--abort-loss", "6", "--impl", "reference")
    assert r["diverged"] and r["perplexity"] == float("inf"), r
    assert len(r["train_loss"]) < 3, r


def test_dgc_mode_at_density_one_is_the_dense_run():
    """--codec dgc (DGC as under Adam: accumulate, send the top, zero what was sent): at density 1
    every value is sent each step, so the run is the dense one; at a small density it is not."""
    common = ("--ranks", "2", "--optimizer", "adam", "--lr", "3e-3", "--impl", "reference")
    dense = sim(*common, "--codec", "none")
    full = sim(*common, "--codec", "dgc", "--density", "1")
    sparse = sim(*common, "--codec", "dgc", "--density", "0.01", "--density-warmup", "5")
    assert (full["codec"], full["density"], sparse["density_warmup"]) == ("dgc", 1.0, 5)
    assert full["test_loss"] == pytest.approx(dense["test_loss"], rel=1e-6), (full, dense)
    assert sparse["test_loss"] != dense["test_loss"] and 0 < sparse["test_loss"] < 4.6, sparse
