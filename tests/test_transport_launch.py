"""The other ways in, each launched for real under a timeout: ``horovodrun --gloo`` (digits
example, process sets), process sets under mpirun, and DDP through torchrun.

The transport only moves bytes, so on the same seeds every way in must end with bitwise the
parameters of the mpirun run (same digest), not merely a similar accuracy.
"""
from __future__ import annotations

import pytest

from launchers import horovodrun_gloo, last_json, mpirun, run, torchrun

EPOCHS = 10
TIMEOUT = 300
TRAIN = ["examples/train.py", "--epochs", str(EPOCHS), "--json", "--no-progress"]
TRAIN_DDP = ["examples/train_ddp.py", "--epochs", str(EPOCHS), "--json", "--no-progress"]

pytestmark = pytest.mark.timeout(3 * TIMEOUT)
_mpirun_runs: dict = {}


def mpirun_digits(np_: int, codec: list) -> dict:
    key = (np_, tuple(codec))
    if key not in _mpirun_runs:
        _mpirun_runs[key] = last_json(run(mpirun(np_, *TRAIN, *codec), TIMEOUT))
    return _mpirun_runs[key]


def check_same_as_mpirun(got: dict, np_: int, codec: list) -> None:
    want = mpirun_digits(np_, codec)
    assert got["params_identical"] is True and got["ranks"] == np_, got
    assert got["test_accuracy"] > 0.9, got
    assert got["params_digest"] == want["params_digest"], (got, want)
    assert got["test_accuracy"] == want["test_accuracy"]


@pytest.mark.parametrize("codec", [["--codec", "onebit"],
                                   ["--codec", "qsgd", "--codec-opt", "pattern=two_phase"]], ids=["onebit", "qsgd-2ph"])
def test_horovodrun_gloo_digits_equals_mpirun(codec):
    got = last_json(run(horovodrun_gloo(2, *TRAIN, *codec), TIMEOUT))
    assert got["transport"] == "HorovodCommunicator", got  # transport="auto" on Gloo
    check_same_as_mpirun(got, 2, codec)


@pytest.mark.parametrize("np_", [2, 4])
def test_ddp_digits_equals_mpirun(np_):
    got = last_json(run(torchrun(np_, *TRAIN_DDP, "--codec", "onebit"), TIMEOUT))
    assert got["steps"] == EPOCHS * (1437 // (np_ * 32)), got
    check_same_as_mpirun(got, np_, ["--codec", "onebit"])


@pytest.mark.parametrize("launcher", ["mpirun", "horovodrun-gloo"])
def test_process_sets(launcher):
    cmd = (mpirun if launcher == "mpirun" else horovodrun_gloo)(3, "-m", "tests.launch.process_sets")
    out = run(cmd, TIMEOUT).stdout
    assert "process sets OK on " + ("mpi" if launcher == "mpirun" else "gloo") in out, out
