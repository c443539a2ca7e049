"""LowPrecisionErrorFeedback (bf16/fp16 residuals, FSDP2's residual_dtype=): each step equals the
fp32 error feedback's, only the carried residual is rounded, and codec rules such as onebit's
residual_cap hold as with fp32 residuals."""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.state.error_feedback import ErrorFeedback
from horovod_gradcomp.state.low_precision_feedback import LowPrecisionErrorFeedback


@pytest.mark.parametrize("cap", [0.0, 0.05])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_step_is_the_fp32_step_with_the_residual_rounded(cap, dtype):
    g = torch.Generator().manual_seed(0)
    grad = torch.randn(33, 17, generator=g)
    codec = hgc.get_codec("onebit", residual_cap=cap)
    wide, low = ErrorFeedback(), LowPrecisionErrorFeedback(dtype)
    sent_wide = codec.decode(wide.encode(codec, "w", grad))
    sent_low = codec.decode(low.encode(codec, "w", grad))
    assert torch.equal(sent_wide, sent_low)
    assert low.residuals["w"].dtype == dtype
    assert torch.equal(low.residuals["w"], wide.residuals["w"].to(dtype))
    if cap:   # the cap holds: each column's residual at most 5% of its gradient's norm (onebit groups by column)
        assert low.residuals["w"].float().norm() <= cap * grad.norm() * 1.01
        uncapped = grad - codec.decode(codec.encode(grad))
        assert low.residuals["w"].float().norm() < 0.5 * uncapped.norm()
