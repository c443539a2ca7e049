"""``hgc.native_available("cuda")`` / ``hgc.native_cuda_status()``: which path CUDA gradients
take and why; without the CUDA kernels a native codec refuses CUDA tensors by name."""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.native import NativeUnavailableError, require_native_device


def test_status_is_consistent_and_says_why():
    ok, why = hgc.native_cuda_status()
    assert ok == hgc.native_available("cuda") == hgc.native_available("cuda:0")
    assert isinstance(why, str) and len(why) > 20
    assert hgc.native_available("cpu") == hgc.native_available()
    if not torch.cuda.is_available():
        assert not ok and ("is_available() is False" in why or "without its CUDA kernels" in why)
    if ok:
        assert hgc.native_has_cuda()


def test_unknown_device_is_an_error():
    with pytest.raises(ValueError, match="device must be"):
        hgc.native_available("tpu")


def test_cpu_tensors_always_pass_the_device_check():
    require_native_device(torch.device("cpu"), "terngrad")


@pytest.mark.skipif(not hgc.native_available() or hgc.native_has_cuda(),
                    reason="only for an extension built without its CUDA kernels")
def test_cpu_only_build_refuses_cuda_tensors_by_name():
    with pytest.raises(NativeUnavailableError, match="qsgd: got tensors on cuda.*without its CUDA kernels"):
        require_native_device(torch.device("cuda", 0), "qsgd")
