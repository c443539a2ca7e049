"""Lightning's FSDP2 strategy (ModelParallelStrategy) with a codec: 2 CPU processes on gloo, launched
for real by tests/lightning_fsdp_worker.py (Lightning starts the second process)."""
from __future__ import annotations

import shutil
import sys

import pytest

from launchers import last_json, run

pytest.importorskip("lightning")
TIMEOUT = 300
pytestmark = pytest.mark.timeout(4 * TIMEOUT)


def fit(*args: str) -> dict:
    result = last_json(run([sys.executable, "tests/lightning_fsdp_worker.py", *args], TIMEOUT))
    assert result["ok"], result
    return result


def test_lightning_fsdp2_strategy_trains_with_the_codec():
    """onebit through CompressedModelParallelStrategy: 6 steps, every module's reduce-scatter compressed
    (fewer bytes than FSDP2's own), losses close to ModelParallelStrategy's."""
    dense = fit("none", "6")
    codec = fit("onebit", "6")
    stats = codec["stats"]
    assert stats["steps"] == 6 and stats["calls"] == 12, stats
    assert stats["bytes_sent"] < stats["bytes_dense"], stats
    assert abs(sum(codec["losses"]) - sum(dense["losses"])) < 0.2 * sum(dense["losses"])


def test_lightning_fsdp2_resume_loads_the_compression_state(tmp_path):
    """3 steps, Trainer.save_checkpoint (Lightning's distributed checkpoint plus the compression state in
    hgc_compression/), then fit(ckpt_path=...) to step 6 in fresh processes: the first resumed loss is
    bitwise the uninterrupted run's 4th and the compression continues from step 3 (without
    hgc_compression/ it starts again from 0, with a warning). Lightning's own resume is not bitwise
    after that here, with or without a codec (ModelParallelStrategy without a codec differs from step 5)."""
    whole = fit("onebit", "6")
    ckpt = tmp_path / "ckpt"
    fit("onebit", "3", "--save", str(ckpt))
    resumed = fit("onebit", "6", "--resume", str(ckpt))
    assert resumed["stats"]["steps"] == 3 and resumed["step"] == 6, resumed
    assert resumed["losses"][0] == whole["losses"][3]
    shutil.rmtree(ckpt / "hgc_compression")
    fresh = fit("onebit", "6", "--resume", str(ckpt))
    assert fresh["step"] == 3, fresh
