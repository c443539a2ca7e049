"""On/off options refuse anything but a bool (``bool("false")`` is True), and the examples'
``--codec-opt`` reads ``true``/``false`` as bools."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.flags import require_flag

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
from common import codec_options  # noqa: E402


@pytest.mark.parametrize("value", [True, False, np.bool_(True), np.bool_(False)])
def test_bools_pass_through(value):
    got = require_flag("x", "flag", value)
    assert got is bool(value)


@pytest.mark.parametrize("value", ["false", "True", 0, 1, None, 1.0, torch.tensor(True)])
def test_anything_else_is_refused_with_owner_name_and_value(value):
    with pytest.raises(ValueError, match=r"^owner: flag must be True or False, got "):
        require_flag("owner", "flag", value)


def test_dgc_factory_refuses_a_string_flag():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match="dgc: momentum_masking must be True or False, got 'false'"):
        hgc.Compression.dgc(model.named_parameters(), momentum=0.9, momentum_masking="false",
                            check_optimizer=False, rank_stream=(0, 1))


@pytest.mark.parametrize("option", ["error_feedback", "overlap", "check_agreement"])
def test_every_codec_factory_refuses_a_string_flag(option):
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=f"{option} must be True or False, got 'false'"):
        hgc.Compression.codec("onebit", model.named_parameters(), **{option: "false"})


def test_codec_opt_reads_true_and_false_in_any_case():
    got = codec_options(["momentum_masking=false", "a=TRUE", "b=False", "density=0.01", "c=name"])
    assert got == {"momentum_masking": False, "a": True, "b": False, "density": 0.01, "c": "name"}
    assert got["momentum_masking"] is False and got["a"] is True
