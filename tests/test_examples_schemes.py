"""End-to-end: examples/schemes.py under ``mpirun -np 2`` (briefly) for two asynchronous
schemes, one of them with onebit-encoded pushes (the synchronous ones are checked in
tests/mpi/mpi_schemes.py)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from launchers import final_json, mpirun, run

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "schemes.py"
RUN_TIMEOUT = 180

pytestmark = [
    pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH"),
    pytest.mark.timeout(RUN_TIMEOUT + 30),
]


def run_example(*args: str) -> dict:
    return final_json(run(mpirun(2, str(SCRIPT), *args, "--epochs", "6", "--json", "--no-progress"), RUN_TIMEOUT))


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
