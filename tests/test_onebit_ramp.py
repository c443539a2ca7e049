"""onebit's opt-in gradient warm-up (``lr_warmup_steps``, formerly ``ramp_steps``): the factor, the
option and its old name, checkpoints that carry the old name, and the exchange in one process.

The exchange under mpirun is in tests/mpi/mpi_onebit_warmup.py; why the warm-up exists is in
docs/results/onebit_divergence.md. That the defaults rescale nothing is tested in
tests/test_no_rescaling.py.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.onebit import saved_codec_repr
from horovod_gradcomp.exchange.step_ramp import apply_ramp, ramp_factor

from one_rank import OneRank


def test_factor_rises_linearly_to_one_and_stays_there():
    assert [ramp_factor(4, t) for t in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert [ramp_factor(1, t) for t in range(3)] == [1.0, 1.0, 1.0]
    assert all(ramp_factor(0, t) == 1.0 for t in range(3))
    assert ramp_factor(300, 0) == 1 / 300 and ramp_factor(300, 298) == 299 / 300 and ramp_factor(300, 299) == 1.0


def test_apply_ramp_scales_in_place_and_leaves_factor_one_alone():
    a, b = torch.ones(3), torch.full((2, 2), 4.0, dtype=torch.float16)
    apply_ramp([a, b], 0.5)
    assert torch.equal(a, torch.full((3,), 0.5)) and torch.equal(b, torch.full((2, 2), 2.0, dtype=torch.float16))
    c = torch.tensor([float("nan"), 1.0])
    apply_ramp([c], 1.0)
    assert c[1] == 1.0 and torch.isnan(c[0])


def test_option_is_off_by_default_validated_and_named_in_the_agreement_key():
    assert hgc.get_codec("onebit").lr_warmup_steps == 0   # no rescaling unless asked for (issue 30)
    codec = hgc.get_codec("onebit", lr_warmup_steps=30)
    assert codec.lr_warmup_steps == 30 and "lr_warmup_steps=30" in codec.agreement_key()
    for bad in (-1, 2.5, True, "3", None):
        with pytest.raises(ValueError, match="lr_warmup_steps"):
            hgc.get_codec("onebit", lr_warmup_steps=bad)


def test_old_name_still_means_the_same_with_a_warning():
    with pytest.warns(FutureWarning, match="ramp_steps is now called lr_warmup_steps"):
        codec = hgc.get_codec("onebit", ramp_steps=30)
    assert codec.lr_warmup_steps == 30 and repr(codec) == repr(hgc.get_codec("onebit", lr_warmup_steps=30))
    with pytest.raises(ValueError, match="ramp_steps"), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        hgc.get_codec("onebit", ramp_steps=-1)
    with pytest.raises(ValueError, match="give lr_warmup_steps only"):
        hgc.get_codec("onebit", ramp_steps=3, lr_warmup_steps=3)


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(5, 3)


def _old_default_checkpoint(model):
    """A state_dict as the code before issue 30 wrote it with onebit's defaults (rows, ramp_steps=300)."""
    comp = hgc.Compression.onebit(model.named_parameters(), communicator=OneRank(), lr_warmup_steps=300)
    comp.exchange(_grads(0))
    state = comp.state_dict()
    assert state["codec"] == "OneBitCodec(impl='native', scales='rows', lr_warmup_steps=300)"
    state["codec"] = "OneBitCodec(impl='native', scales='rows', ramp_steps=300)"   # the old spelling
    return state


def test_checkpoint_with_the_old_default_ramp_resumes_only_with_the_same_warmup():
    """Resuming never drops the warm-up silently: the new defaults refuse the old default's
    checkpoint with a message naming the option; ``lr_warmup_steps=300`` resumes it."""
    model = _model()
    state = _old_default_checkpoint(model)
    fresh = hgc.Compression.onebit(model.named_parameters(), communicator=OneRank())
    with pytest.raises(ValueError, match=r"ramp_steps=300.*pass the same lr_warmup_steps to resume it as it ran"):
        fresh.load_state_dict(state)
    same = hgc.Compression.onebit(model.named_parameters(), communicator=OneRank(), lr_warmup_steps=300)
    same.load_state_dict(state)
    assert same.state.step == 1
    assert saved_codec_repr("OneBitCodec(impl='native', scales='rows', ramp_steps=300)") == repr(same.codec)
    assert saved_codec_repr("QSGDCodec(levels=4)") == "QSGDCodec(levels=4)"


def _grads(step):
    gen = torch.Generator().manual_seed(7 + step)
    return {"bias": torch.randn(3, generator=gen), "weight": torch.randn(3, 5, generator=gen)}


@pytest.mark.parametrize("scales", ["columns", "rows"])
@pytest.mark.parametrize("warmup_steps", [0, 2])
def test_results_are_the_unscaled_results_scaled_with_the_same_residuals_and_bytes(scales, warmup_steps):
    """Step t's results are bitwise the results of the same compression without the warm-up times
    (t + 1) / N; the residuals and every byte count are those of the compression without it."""
    n_ramp = 4
    model = torch.nn.Linear(5, 3)
    ramped = hgc.Compression.onebit(model.named_parameters(), lr_warmup_steps=n_ramp, scales=scales,
                                    warmup_steps=warmup_steps)
    plain = hgc.Compression.onebit(model.named_parameters(), scales=scales, warmup_steps=warmup_steps)
    for step in range(n_ramp + 2):
        out_ramped = ramped.exchange(_grads(step))
        out_plain = plain.exchange(_grads(step))
        for name in out_plain:
            expected = out_plain[name] * ramp_factor(n_ramp, step)
            assert torch.equal(out_ramped[name], expected), (step, name)
        assert ramped.memory.residuals.keys() == plain.memory.residuals.keys()
        for name, r in plain.memory.residuals.items():
            assert torch.equal(ramped.memory.residuals[name], r), (step, name)
    counts = lambda s: {k: v for k, v in s.items() if not k.endswith("_s")}  # noqa: E731 (timings differ)
    assert counts(ramped.stats()) == counts(plain.stats()) and ramped.stats()["steps"] == n_ramp + 2
