"""Minibatch-size selection: the rule on given objectives, and a trial on a tiny problem."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from horovod_gradcomp.training.minibatch import select_minibatch_size, slice_trial


def from_table(table):
    tried = []

    def trial(size):
        tried.append(size)
        return table[size]
    return trial, tried


def test_keeps_the_largest_size_within_tolerance_of_the_best():
    trial, tried = from_table({64: 1.00, 8: 1.01, 16: 0.99, 32: 1.005, 128: 1.2})
    choice = select_minibatch_size(trial, [64, 8, 16, 32, 128], tolerance=0.02)
    assert tried == [8, 16, 32, 64, 128]
    assert choice.size == 64 and choice.best == 0.99
    assert choice.allowed == pytest.approx(0.99 * 1.02)
    assert list(choice.objective) == [8, 16, 32, 64, 128]
    assert select_minibatch_size(from_table({8: 1.0, 16: 1.1})[0], [8, 16], tolerance=0.0).size == 8
    assert select_minibatch_size(from_table({8: 1.0, 16: 1.1})[0], [8, 16], abs_tolerance=0.2).size == 16


def test_diverged_trials_are_never_chosen():
    trial, _ = from_table({8: 0.5, 16: math.nan, 32: math.inf})
    assert select_minibatch_size(trial, [8, 16, 32], tolerance=10.0).size == 8
    with pytest.raises(ValueError, match="diverged"):
        select_minibatch_size(from_table({8: math.nan})[0], [8])


@pytest.mark.parametrize("candidates", [[], [0], [8, 8], [4.0], [True]])
def test_bad_candidates(candidates):
    with pytest.raises(ValueError):
        select_minibatch_size(lambda s: 0.0, candidates)


def test_bad_tolerance():
    with pytest.raises(ValueError):
        select_minibatch_size(lambda s: 0.0, [8], tolerance=-0.1)


def tiny_problem():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    y = (x[:, 0] > 0).long()

    def make_model():
        torch.manual_seed(0)
        return torch.nn.Linear(4, 2)
    return make_model, (x, y)


def test_slice_trial_is_deterministic():
    make_model, data = tiny_problem()
    trial = slice_trial(make_model, lambda ps, lr: torch.optim.SGD(ps, lr=lr), F.cross_entropy, data,
                        lr_per_sample=0.02, epochs=2)
    assert trial(8) == trial(8)
    choice = select_minibatch_size(trial, [4, 8, 64], tolerance=0.05)
    assert all(math.isfinite(v) for v in choice.objective.values())
    assert choice.size == max(s for s, v in choice.objective.items() if v <= choice.allowed)
    with pytest.raises(ValueError, match="exceeds"):
        trial(65)


def test_slice_trial_reports_divergence_as_nan():
    make_model, data = tiny_problem()
    trial = slice_trial(make_model, lambda ps, lr: torch.optim.SGD(ps, lr=lr), lambda out, y: out.sum() * 1e30,
                        data, lr_per_sample=1e10)
    assert math.isnan(trial(4))


def test_slice_trial_checks_its_arguments():
    make_model, (x, y) = tiny_problem()
    opt = lambda ps, lr: torch.optim.SGD(ps, lr=lr)  # noqa: E731
    with pytest.raises(ValueError):
        slice_trial(make_model, opt, F.cross_entropy, (x, y[:3]), lr_per_sample=0.1)
    with pytest.raises(ValueError):
        slice_trial(make_model, opt, F.cross_entropy, (x, y), lr_per_sample=0.0)


def test_example_prints_the_choice_and_the_evidence():
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "examples/minibatch_select.py", "--candidates", "8,32", "--epochs", "1",
                          "--json"], cwd=root, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["size"] in (8, 32) and set(out["objective"]) == {"8", "32"}
