"""The codecs' Adam-aware defaults (hvd_adapter/adam_defaults.py): taken under the Adam family,
never under SGD, never over an explicit option; logged once; kept by checkpoints."""
from __future__ import annotations

import logging

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.hvd_adapter.adam_defaults import ADAM_FAMILY, is_adam_family
from one_rank import OneRank

#: codec factory -> the option its adam_defaults set, its SGD default and its Adam default
CASES = {
    "terngrad": ("clip", 2.5, 1.0),   # SGD: the paper's clip at 2.5 sigma (sgd_defaults)
    "dgc": ("density", 0.001, 0.1),
    "onebit": ("warmup_steps", 0, 100),
}


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _make(name, model, **options):
    return getattr(hgc.Compression, name)(model.named_parameters(), communicator=OneRank(), **options)


class _Distributed:
    """What ``hvd.DistributedOptimizer`` is to the compression: the optimizer whose method calls
    ``compress`` (found by frame, as under Horovod) and then ``decompress``."""

    def __init__(self, optimizer, compression):
        self.optimizer, self._compression = optimizer, compression

    def exchange(self, params):
        outs = [self._compression.compress(p.grad) for p in params]
        return [self._compression.decompress(o, name) for o, name in outs]


class _AdamDistributed(torch.optim.Adam):
    """An Adam subclass holding the compression, as Horovod's DistributedOptimizer class is."""

    def __init__(self, params, compression):
        super().__init__(params, lr=1e-3)
        self._compression = compression

    def exchange(self):
        params = [p for g in self.param_groups for p in g["params"]]
        outs = [self._compression.compress(p.grad) for p in params]
        return [self._compression.decompress(o, name) for o, name in outs]


def _backward(model):
    model(torch.randn(4, 6)).square().sum().backward()


@pytest.mark.parametrize("name", sorted(CASES))
def test_sgd_keeps_the_defaults_adam_takes_the_adam_defaults(name, caplog):
    option, sgd_value, adam_value = CASES[name]
    model = _model()
    sgd = _make(name, model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert getattr(sgd.codec, option) == sgd_value
    assert sgd.adapted_options == type(sgd.codec).sgd_defaults   # SGD's own table (onebit: the residual cap)
    with caplog.at_level(logging.WARNING, logger="horovod_gradcomp"):
        adam = _make(name, model, optimizer=torch.optim.Adam(model.parameters()))
    assert getattr(adam.codec, option) == adam_value
    assert adam.adapted_options == {option: adam_value}
    lines = [r.getMessage() for r in caplog.records if "Adam defaults" in r.getMessage()]
    assert len(lines) == 1 and f"{option}={adam_value}" in lines[0] and "Adam family" in lines[0]
    if name == "dgc":   # the density the memory's schedule gives every step; this 4x6 model is
        # far below 1,024 values, so every encode sends all of them (the default density's floor)
        assert adam.memory.scheduled_density() == adam_value
        assert adam.memory.current_density() == 1.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_explicit_option_wins(name):
    option, sgd_value, adam_value = CASES[name]
    explicit = {"clip": 2.5, "density": 0.01, "warmup_steps": 7}[option]
    model = _model()
    comp = _make(name, model, optimizer=torch.optim.AdamW(model.parameters()), **{option: explicit})
    assert getattr(comp.codec, option) == explicit and comp.adapted_options == {}


def test_qsgd_has_no_adam_defaults():
    model = _model()
    comp = _make("qsgd", model, optimizer=torch.optim.Adam(model.parameters()))
    assert comp.adapted_options == {} and type(comp.codec).adam_defaults == {}


def test_the_family():
    params = [torch.nn.Parameter(torch.zeros(2))]
    for cls in ADAM_FAMILY:
        assert is_adam_family(cls(params))
    for cls in (torch.optim.SGD, torch.optim.Adagrad, torch.optim.RMSprop):
        assert not is_adam_family(cls(params, lr=0.1))
    assert {c.__name__ for c in ADAM_FAMILY} == {"Adam", "AdamW", "NAdam", "RAdam", "Adamax"}


def test_under_horovod_the_optimizer_is_found_at_the_first_compress():
    """No optimizer= argument: the DistributedOptimizer (an Adam subclass) calling compress
    sets the Adam defaults before the first gradient is encoded."""
    pytest.importorskip("horovod.torch")   # compress() checks the DistributedOptimizer's Horovod options
    model = _model()
    comp = _make("terngrad", model)
    assert comp.codec.clip is None
    opt = _AdamDistributed(model.parameters(), comp)
    _backward(model)
    means = opt.exchange()
    assert comp.codec.clip == 1.0 and comp.adapted_options == {"clip": 1.0}
    assert all(torch.isfinite(m).all() for m in means)


def test_under_horovod_with_sgd_nothing_changes():
    pytest.importorskip("horovod.torch")   # compress() checks the DistributedOptimizer's Horovod options
    model = _model()
    comp = _make("dgc", model)
    holder = _Distributed(torch.optim.SGD(model.parameters(), lr=0.1), comp)
    _backward(model)
    holder.exchange(list(model.parameters()))
    assert comp.codec.density == 0.001 and comp.adapted_options == {}


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_checkpoint_resumes_with_the_adam_defaults_it_ran_with(name):
    option, _, adam_value = CASES[name]
    model = _model()
    comp = _make(name, model, optimizer=torch.optim.Adam(model.parameters()))
    state = comp.state_dict()
    fresh = _make(name, model)   # the optimizer is not known yet when a job loads its state
    fresh.load_state_dict(state)
    assert getattr(fresh.codec, option) == adam_value and repr(fresh.codec) == repr(comp.codec)
    assert repr(fresh.memory) == repr(comp.memory)
    explicit = _make(name, model, **{option: adam_value})   # explicit, equal to the Adam default
    explicit.load_state_dict(state)
    assert explicit.adapted_options == {}
    other = {"clip": 2.5, "density": 0.01, "warmup_steps": 7}[option]
    with pytest.raises(ValueError, match="checkpoint was written by"):
        _make(name, model, **{option: other}).load_state_dict(state)


def test_a_checkpoint_of_the_adam_defaults_loads_with_weights_only(tmp_path):
    model = _model()
    comp = _make("dgc", model, optimizer=torch.optim.Adam(model.parameters()))
    torch.save(comp.state_dict(), tmp_path / "s.pt")
    state = torch.load(tmp_path / "s.pt", weights_only=True)
    assert state["adapted_options"] == {"density": 0.1}


@pytest.mark.parametrize("opt_cls", [torch.optim.SGD, torch.optim.NAdam])
def test_the_guard_takes_them_at_the_first_step_of_the_optimizer(opt_cls, caplog):
    """What the DDP hook registers when it is given no optimizer=: the first step() decides."""
    from horovod_gradcomp.hvd_adapter.adam_defaults import AdamDefaultsGuard
    model = _model()
    comp = _make("terngrad", model)
    guard = AdamDefaultsGuard(comp, model.parameters())
    other = torch.nn.Parameter(torch.zeros(2))
    torch.optim.Adam([other]).step()   # an optimizer holding none of the parameters: ignored
    assert comp.adapted_options == {}
    opt = opt_cls(model.parameters(), lr=0.1)
    _backward(model)
    with caplog.at_level(logging.WARNING, logger="horovod_gradcomp"):
        opt.step()
        opt.step()
    lines = [r.getMessage() for r in caplog.records if "Adam defaults" in r.getMessage()]
    if opt_cls is torch.optim.SGD:
        # no Adam default under SGD; TernGrad's own SGD table (clip 2.5) instead
        assert comp.codec.clip == 2.5 and comp.adapted_options == {"clip": 2.5} and not lines
    else:
        assert comp.codec.clip == 1.0 and len(lines) == 1 and "NAdam" in lines[0] and "from step 0 on" in lines[0]
    guard = None   # noqa: F841 (the hook goes with the guard)


def test_the_guard_leaves_a_resumed_state_alone():
    from horovod_gradcomp.hvd_adapter.adam_defaults import AdamDefaultsGuard
    model = _model()
    state = _make("dgc", model, optimizer=torch.optim.Adam(model.parameters())).state_dict()
    comp = _make("dgc", model)
    comp.load_state_dict(state)
    guard = AdamDefaultsGuard(comp, model.parameters())   # noqa: F841
    _backward(model)
    torch.optim.Adam(model.parameters()).step()
    assert comp.adapted_options == {"density": 0.1} and comp.codec.density == 0.1


def test_a_checkpoint_from_before_the_adam_defaults_resumes_as_it_ran():
    """A state written under Adam at the SGD defaults (no adapted_options): after the load,
    neither the first compress nor the first step takes the Adam defaults."""
    pytest.importorskip("horovod.torch")   # compress() checks the DistributedOptimizer's Horovod options
    from horovod_gradcomp.hvd_adapter.adam_defaults import AdamDefaultsGuard
    model = _model()
    old = _make("terngrad", model).state_dict()
    old.pop("adapted_options")
    comp = _make("terngrad", model)
    comp.load_state_dict(old)
    guard = AdamDefaultsGuard(comp, model.parameters())   # noqa: F841
    opt = _AdamDistributed(model.parameters(), comp)
    _backward(model)
    opt.exchange()
    opt.step()
    assert comp.codec.clip is None and comp.adapted_options == {}
