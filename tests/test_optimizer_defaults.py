"""Optimizer-aware codec defaults (horovod/adam_defaults.py's FAMILIES): which family an optimizer
belongs to, which table a codec takes under it, that an explicit option wins, the one log line,
and the checkpoint round trip; and DGC's density for node means (codecs/dgc.py
density_for_mean, DGCMemory.set_mean_of)."""
from __future__ import annotations

import logging

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.dgc import DGCCodec, density_for_mean
from horovod_gradcomp.codecs.terngrad import TernGradCodec
from horovod_gradcomp.hvd_adapter.adam_defaults import (FAMILIES, apply_adam_defaults, apply_optimizer_defaults,
                                                    optimizer_family)
from one_rank import OneRank


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _make(name, model, **options):
    return getattr(hgc.Compression, name)(model.named_parameters(), communicator=OneRank(), **options)


class _MySGD(torch.optim.SGD):
    """A user's SGD subclass (as Horovod's DistributedOptimizer is one of the class it wraps)."""


def test_the_families_and_which_optimizer_is_in_which():
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert [name for name, _, _ in FAMILIES] == ["Adam", "SGD"]
    assert optimizer_family(torch.optim.AdamW(params)) == ("Adam", "adam_defaults")
    assert optimizer_family(torch.optim.SGD(params, lr=0.1, momentum=0.9)) == ("SGD", "sgd_defaults")
    assert optimizer_family(_MySGD(params, lr=0.1)) == ("SGD", "sgd_defaults")
    for other in (torch.optim.Adagrad(params), torch.optim.RMSprop(params), None):
        assert optimizer_family(other) is None
    assert apply_adam_defaults is apply_optimizer_defaults   # one mechanism, the adapters' old name


def test_every_codec_declares_both_tables():
    for name in hgc.available_codecs():
        cls = type(hgc.get_codec(name, impl="reference"))
        assert isinstance(cls.adam_defaults, dict) and isinstance(cls.sgd_defaults, dict), name


@pytest.fixture
def terngrad_with_sgd_defaults(monkeypatch):
    """TernGrad given another SGD table for the test (its own clips at 2.5): the mechanism, codec-blind."""
    monkeypatch.setattr(TernGradCodec, "sgd_defaults", {"clip": 3.0})


def test_sgd_takes_the_sgd_table_adam_the_adam_table(terngrad_with_sgd_defaults, caplog):
    model = _model()
    with caplog.at_level(logging.WARNING, logger="horovod_gradcomp"):
        sgd = _make("terngrad", model, optimizer=_MySGD(model.parameters(), lr=0.1))
    assert sgd.codec.clip == 3.0 and sgd.adapted_options == {"clip": 3.0}
    lines = [r.getMessage() for r in caplog.records if "defaults" in r.getMessage()]
    assert len(lines) == 1 and "took the SGD defaults clip=3.0" in lines[0] and "SGD (SGD family)" in lines[0]
    adam = _make("terngrad", model, optimizer=torch.optim.Adam(model.parameters()))
    assert adam.codec.clip == 1.0 and adam.adapted_options == {"clip": 1.0}
    other = _make("terngrad", model, optimizer=torch.optim.Adagrad(model.parameters()))
    assert other.codec.clip is None and other.adapted_options == {}


def test_an_explicit_option_wins_under_sgd(terngrad_with_sgd_defaults):
    model = _model()
    comp = _make("terngrad", model, clip=2.5, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert comp.codec.clip == 2.5 and comp.adapted_options == {}


def test_the_sgd_defaults_round_trip_a_checkpoint(terngrad_with_sgd_defaults, tmp_path):
    model = _model()
    comp = _make("terngrad", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    torch.save(comp.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    assert state["adapted_options"] == {"clip": 3.0}
    fresh = _make("terngrad", model)   # the optimizer is not known yet when a job loads its state
    fresh.load_state_dict(state)
    assert fresh.codec.clip == 3.0 and repr(fresh.codec) == repr(comp.codec)
    # after the load nothing more is taken, even under another family
    assert apply_optimizer_defaults(fresh, torch.optim.Adam(model.parameters())) == {}
    assert fresh.codec.clip == 3.0
    with pytest.raises(ValueError, match="checkpoint was written by"):
        _make("terngrad", model, clip=2.5).load_state_dict(state)


def test_the_guard_takes_the_sgd_table_at_the_first_step(terngrad_with_sgd_defaults, caplog):
    from horovod_gradcomp.hvd_adapter.adam_defaults import AdamDefaultsGuard
    model = _model()
    comp = _make("terngrad", model)
    guard = AdamDefaultsGuard(comp, model.parameters())   # noqa: F841 (the hook goes with the guard)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 6)).square().sum().backward()
    with caplog.at_level(logging.WARNING, logger="horovod_gradcomp"):
        opt.step()
        opt.step()
    lines = [r.getMessage() for r in caplog.records if "SGD defaults" in r.getMessage()]
    assert comp.codec.clip == 3.0 and len(lines) == 1 and "from step 0 on" in lines[0]


# -- DGC: the density for node means ------------------------------------------------------------

def test_density_for_mean():
    assert density_for_mean(0.001, 1) == 0.001
    assert density_for_mean(0.001, 2) == pytest.approx(0.002)
    assert density_for_mean(0.1, 8) == pytest.approx(0.8)
    assert density_for_mean(0.3, 4) == 1.0   # capped
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="int >= 1"):
            density_for_mean(0.1, bad)
    with pytest.raises(ValueError, match="density"):
        density_for_mean(0.0, 2)


def test_node_means_select_at_l_times_the_default_density():
    model = _model()
    comp = _make("dgc", model, momentum=0.0, check_optimizer=False)
    # this small model's floor of 1,024 values would select everything: the L factor alone here
    # (the floor's order with it: tests/test_dgc_memory.py)
    assert comp.memory.current_density() == 1.0
    comp.memory.set_density_floor(0.0)
    assert comp.memory.current_density() == DGCCodec.DEFAULT_DENSITY
    comp.memory.set_mean_of(2)
    assert comp.memory.current_density() == pytest.approx(2 * DGCCodec.DEFAULT_DENSITY)
    v = torch.randn(10_000)
    payload = comp.memory.encode(comp.codec, "w", v)
    sent = int((comp.codec.decode(payload) != 0).sum())
    assert sent == 20   # ceil(0.002 * 10000)
    comp.memory.set_mean_of(1)
    assert comp.memory.current_density() == DGCCodec.DEFAULT_DENSITY


def test_an_explicit_density_is_used_as_given_for_node_means():
    model = _model()
    comp = _make("dgc", model, density=0.001, momentum=0.0, check_optimizer=False)
    comp.memory.set_mean_of(4)
    assert comp.memory.current_density() == 0.001


def test_the_adam_density_and_the_warm_up_scale_too():
    model = _model()
    adam = _make("dgc", model, optimizer=torch.optim.Adam(model.parameters()), momentum=0.0, check_optimizer=False)
    adam.memory.set_density_floor(0.0)   # the L factor alone (see above)
    adam.memory.set_mean_of(2)
    assert adam.memory.current_density() == pytest.approx(0.2)   # the Adam default 0.1, not passed: scaled
    warm = _make("dgc", model, momentum=0.0, check_optimizer=False, warmup_length=10, warmup_unit="step")
    warm.memory.set_mean_of(8)
    assert warm.memory.scheduled_density() == pytest.approx(0.25)
    assert warm.memory.current_density() == 1.0   # 8 x 0.25, capped
    with pytest.raises(ValueError, match="int >= 1"):
        warm.memory.set_mean_of(0)


# -- the tables as shipped ------------------------------------------------------------------------

def test_onebit_takes_the_residual_cap_under_sgd_only():
    model = _model()
    sgd = _make("onebit", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    assert sgd.codec.residual_cap == 0.05 and sgd.codec.warmup_steps == 0
    assert sgd.adapted_options == {"residual_cap": 0.05} and "residual_cap=0.05" in repr(sgd.codec)
    adam = _make("onebit", model, optimizer=torch.optim.Adam(model.parameters()))
    assert adam.codec.residual_cap == 0.0 and adam.adapted_options == {"warmup_steps": 100}
    plain = _make("onebit", model)   # no optimizer known (yet): the constructor's defaults
    assert plain.codec.residual_cap == 0.0 and plain.adapted_options == {}
    other = _make("onebit", model, optimizer=torch.optim.Adagrad(model.parameters()))
    assert other.codec.residual_cap == 0.0 and other.adapted_options == {}


def test_an_explicit_residual_cap_wins_under_sgd():
    model = _model()
    for cap in (0.0, 0.5):
        comp = _make("onebit", model, residual_cap=cap, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
        assert comp.codec.residual_cap == cap and comp.adapted_options == {}


def test_onebit_sgd_default_round_trips_a_checkpoint():
    model = _model()
    comp = _make("onebit", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    state = comp.state_dict()
    assert state["adapted_options"] == {"residual_cap": 0.05}
    fresh = _make("onebit", model)
    fresh.load_state_dict(state)
    assert fresh.codec.residual_cap == 0.05 and repr(fresh.codec) == repr(comp.codec)
    with pytest.raises(ValueError, match="checkpoint was written by"):
        _make("onebit", model, residual_cap=0.0).load_state_dict(state)


def test_a_checkpoint_of_the_former_sgd_cap_resumes_as_it_ran():
    """A checkpoint written under SGD when the default cap was 1.0 names it in its adapted options:
    a compression built under SGD today (cap 0.05) takes 1.0 back on load, as the run had it."""
    model = _model()
    old = _make("onebit", model, residual_cap=1.0)
    state = old.state_dict()
    state["adapted_options"] = {"residual_cap": 1.0}      # as the former default recorded it
    today = _make("onebit", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert today.codec.residual_cap == 0.05
    today.load_state_dict(state)
    assert today.codec.residual_cap == 1.0 and today.adapted_options == {"residual_cap": 1.0}


def test_the_sgd_cap_bounds_each_rows_residual_after_the_encode():
    """What the SGD default does to the state: after an encode every row's residual is at most
    0.05 times that row's gradient norm, and the payload is the uncapped encode's."""
    model = _model()
    comp = _make("onebit", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    torch.manual_seed(1)
    grad = torch.randn(40, 30) * torch.logspace(-2, 1, 40)[:, None]   # rows of very different scale
    residual = torch.randn(40, 30)                                      # far larger than 0.05 x the gradient
    uncapped = hgc.get_codec("onebit", impl="reference", scales="rows")
    r0 = residual.clone()
    expect = uncapped.encode(grad, r0)
    got = comp.codec.encode(grad, residual)
    assert torch.equal(got.buffers["bits"], expect.buffers["bits"])
    assert torch.allclose(got.buffers["scales"], expect.buffers["scales"], rtol=1e-6)
    limit = 0.05 * grad.norm(dim=1)
    assert (residual.norm(dim=1) <= limit * (1 + 1e-5)).all()
    assert (r0.norm(dim=1) > 2 * limit).all()           # every row was over the cap: the cap did it


def test_terngrad_clips_at_the_papers_2_5_sigma_under_sgd_only():
    model = _model()
    sgd = _make("terngrad", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    assert sgd.codec.clip == 2.5 and sgd.adapted_options == {"clip": 2.5} and "clip=2.5" in repr(sgd.codec)
    adam = _make("terngrad", model, optimizer=torch.optim.AdamW(model.parameters()))
    assert adam.codec.clip == 1.0 and adam.adapted_options == {"clip": 1.0}
    for other in (None, torch.optim.Adagrad(model.parameters())):
        comp = _make("terngrad", model, optimizer=other)
        assert comp.codec.clip is None and comp.adapted_options == {}
    mine = _make("terngrad", model, clip=4.0, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert mine.codec.clip == 4.0 and mine.adapted_options == {}


def test_a_checkpoint_from_before_the_terngrad_sgd_clip_resumes_unclipped():
    """A run under SGD before TernGrad's SGD table existed took nothing (adapted options empty,
    clip None): a compression built today with optimizer=SGD (clip 2.5) goes back to its
    constructor's clip=None on load, as the run had it; a clip the user passes still wins."""
    model = _model()
    state = _make("terngrad", model).state_dict()
    assert state["adapted_options"] == {} and "clip=None" in state["codec"]
    today = _make("terngrad", model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert today.codec.clip == 2.5
    today.load_state_dict(state)
    assert today.codec.clip is None and today.adapted_options == {}
    with pytest.raises(ValueError, match="checkpoint was written by"):
        _make("terngrad", model, clip=2.5, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)).load_state_dict(state)


def test_the_other_codecs_have_no_sgd_table():
    for name in ("dgc", "qsgd"):
        assert type(hgc.get_codec(name, impl="reference")).sgd_defaults == {}, name
