"""End-to-end, short: examples/train_pipeline.py (with and without double buffering) and
examples/onebit_adagrad.py under ``mpirun -np 2``."""
from __future__ import annotations

import shutil

import pytest

from launchers import final_json, mpirun, run

RUN_TIMEOUT = 180

pytestmark = [
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH"),
    pytest.mark.timeout(RUN_TIMEOUT + 30),
]


def run_example(script: str, *args: str) -> dict:
    """Run an example under mpirun -np 2; its last line (JSON) as a dict."""
    return final_json(run(mpirun(2, f"examples/{script}", "--epochs", "5", "--json", *args), RUN_TIMEOUT))


@pytest.mark.parametrize("pipeline", [False, True])
def test_train_pipeline_learns_with_identical_params(pipeline):
    res = run_example("train_pipeline.py", "--codec", "onebit", *(["--pipeline"] if pipeline else []))
    assert res["params_identical"] and res["pipeline"] == pipeline
    assert res["updates"] == 5 * 22 * (2 if pipeline else 1)
    assert res["test_accuracy"] > 0.85


def test_onebit_adagrad_learns():
    res = run_example("onebit_adagrad.py")
    assert res["params_identical"] and res["optimizer"] == "Adagrad" and res["test_accuracy"] > 0.85
