"""examples/train_fsdp.py's lr schedule and its argument check (the training itself runs in
test_fsdp.py under torchrun)."""
from __future__ import annotations

import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import train_fsdp  # noqa: E402


def test_cosine_goes_from_the_base_lr_to_zero_and_stays():
    base, total = 0.1, 1000
    assert train_fsdp.cosine_lr(base, 0, total) == base
    assert train_fsdp.cosine_lr(base, 500, total) == pytest.approx(base / 2, rel=1e-12)
    assert train_fsdp.cosine_lr(base, 250, total) == pytest.approx(base * (1 + math.cos(math.pi / 4)) / 2)
    assert train_fsdp.cosine_lr(base, total, total) == pytest.approx(0.0, abs=1e-18)
    assert train_fsdp.cosine_lr(base, total + 7, total) == pytest.approx(0.0, abs=1e-18)
    assert train_fsdp.cosine_lr(base, 123, 0) == base   # 0: a constant lr


def test_a_resumed_optimizer_decays_from_its_constructed_lr_not_the_restored_one():
    weight = torch.nn.Parameter(torch.zeros(3))
    saved = torch.optim.SGD([weight], lr=0.1)
    train_fsdp.set_cosine_lr(saved, 900, 1000)   # the lr a checkpoint at step 900 holds
    resumed = torch.optim.SGD([weight], lr=0.1)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.param_groups[0]["lr"] == pytest.approx(train_fsdp.cosine_lr(0.1, 900, 1000))
    train_fsdp.set_cosine_lr(resumed, 500, 1000)
    assert resumed.param_groups[0]["lr"] == pytest.approx(0.05, rel=1e-12)


def test_negative_cosine_steps_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        train_fsdp.parse_args(["--cosine-steps", "-5"])
    assert exit_info.value.code == 2
    assert "--cosine-steps: must be >= 0, got -5" in capsys.readouterr().err
    assert train_fsdp.parse_args(["--cosine-steps", "40"]).cosine_steps == 40
