"""The declared seams: the capabilities every codec declares on ``Codec`` and the ``Memory``
interface that error feedback and DGC's memory implement (what the exchange reads instead of
probing with getattr or isinstance)."""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.base import Codec
from horovod_gradcomp.state import CompressionState, DensitySchedule, DGCMemory, ErrorFeedback, Memory

CAPABILITIES = ("variable_size", "shared_scale", "measures", "shows_nonfinite", "fuses_feedback",
                "default_pattern", "warmup_steps", "lr_warmup_steps", "rank_stream")


@pytest.mark.parametrize("name", ["onebit", "terngrad", "qsgd", "dgc"])
def test_every_codec_answers_every_capability_from_its_class(name):
    codec = hgc.get_codec(name, impl="reference")
    assert isinstance(codec, Codec)
    for attr in CAPABILITIES:
        assert attr in dir(Codec), attr  # declared on the base class, with its default
        getattr(codec, attr)


def test_the_codecs_declare_what_they_do():
    onebit, tern = hgc.get_codec("onebit", impl="reference"), hgc.get_codec("terngrad", impl="reference")
    fixed, elias = hgc.get_codec("qsgd", impl="reference"), hgc.get_codec("qsgd", impl="reference", coding="elias")
    dgc = hgc.get_codec("dgc", impl="reference")
    assert onebit.measures and not tern.measures and not dgc.measures
    assert tern.shared_scale and not onebit.shared_scale and not fixed.shared_scale
    assert elias.variable_size and not fixed.variable_size and dgc.variable_size and not onebit.variable_size
    assert fixed.shows_nonfinite and not onebit.shows_nonfinite
    assert onebit.rank_stream is None  # deterministic: no random stream to place per rank
    assert tern.rank_stream == fixed.rank_stream == dgc.rank_stream == 0
    assert hgc.get_codec("onebit", impl="reference", warmup_steps=3).warmup_steps == 3
    assert fixed.warmup_steps == 0 and dgc.lr_warmup_steps == 0


def test_scale_and_measure_methods_refuse_codecs_without_the_capability():
    qsgd = hgc.get_codec("qsgd", impl="reference")
    with pytest.raises(NotImplementedError, match="shared_scale is False"):
        qsgd.local_scales_many([torch.ones(4)])
    with pytest.raises(NotImplementedError, match="measures is False"):
        qsgd.measure_many([torch.ones(4)])


def test_local_scales_many_defaults_to_local_scale_each():
    class MaxScale(Codec):
        name = "max_scale"
        shared_scale = True

        def local_scale(self, tensor):
            return float(tensor.abs().max())

    assert MaxScale().local_scales_many([torch.tensor([1.0, -3.0]), torch.tensor([2.0])]) == [3.0, 2.0]
    tern = hgc.get_codec("terngrad", impl="reference")
    values = [torch.randn(17), torch.randn(3, 5)]
    assert tern.local_scales_many(values) == [tern.local_scale(v) for v in values]


def _dgc(clip_norm=None):
    return DGCMemory(DensitySchedule(0.1), clip_norm=clip_norm)


def test_both_memories_implement_the_interface_and_declare_their_kind():
    on, off, dgc, clipped = ErrorFeedback(), ErrorFeedback(enabled=False), _dgc(), _dgc(clip_norm=1.0)
    for m in (on, off, dgc, clipped):
        assert isinstance(m, Memory)
    assert on.keeps_residuals and not off.keeps_residuals and not dgc.keeps_residuals
    assert on.supports_owner_stripes and off.supports_owner_stripes and not dgc.supports_owner_stripes
    assert dgc.encodes_own_state and not on.encodes_own_state
    assert on.clip_norm is None and dgc.clip_norm is None and clipped.clip_norm == 1.0
    assert clipped.needs_all_grads and not dgc.needs_all_grads and not on.needs_all_grads
    assert not on.step_nonfinite and not dgc.step_nonfinite
    with pytest.raises(TypeError):
        Memory()  # abstract: a memory must implement encode, snapshots and checkpoints


def test_owner_memory_follows_the_declared_properties():
    assert CompressionState(ErrorFeedback()).owner_memory.enabled
    assert not CompressionState(ErrorFeedback(enabled=False)).owner_memory.enabled
    assert not CompressionState(_dgc()).owner_memory.enabled


def test_residual_calls_on_a_memory_without_residuals_name_the_memory():
    dgc, g = _dgc(), torch.ones(3)
    for call in (lambda: dgc.compensated("w", g), lambda: dgc.residual("w", g), lambda: dgc.peek("w", g)):
        with pytest.raises(TypeError, match="keeps no error-feedback residuals"):
            call()
    ef = ErrorFeedback()
    assert torch.equal(ef.compensated("w", g), g) and ef.peek("w", g) is not None


def test_clock_round_trip_and_refusals():
    ef, dgc = ErrorFeedback(), _dgc()
    assert ef.clock() == {}
    ef.set_clock({})
    with pytest.raises(ValueError, match="clock has keys"):
        ef.set_clock({"epoch": 1})
    dgc.set_epoch(2)
    dgc.end_step()
    other = _dgc()
    other.set_clock(dgc.clock())
    assert (other.epoch, other.step) == (2, 1) and other.clock() == {"epoch": 2, "memory_step": 1}
    with pytest.raises(ValueError, match="clock has keys"):
        other.set_clock({"epoch": 0})


def test_default_options_of_the_interface_check_their_arguments():
    ef = ErrorFeedback()
    ef.set_reduction("sum")
    ef.set_option("density", 0.5)
    ef.set_epoch(3)
    with pytest.raises(ValueError, match="reduction"):
        ef.set_reduction("max")
    with pytest.raises(ValueError, match="set_epoch"):
        ef.set_epoch(-1)
