"""exchange/staging.py: how fused payload bytes reach MPI from the device that encoded them.

The host staging (CPU tensors: the CPU kernels and the OpenMP twin) makes no copy beyond the
concatenation; the exchange's pack/unpack go through it. The CUDA staging's copies and event
run only with a GPU (marked)."""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.codecs import get_codec
from horovod_gradcomp.exchange import fusion, staging
from horovod_gradcomp.exchange.fusion import FusedLayout, pack_variable, unpack_variable


def test_host_gather_writes_into_the_mpi_buffer_and_scatter_copies_nothing():
    parts = [torch.arange(5, dtype=torch.uint8), torch.arange(3, dtype=torch.uint8) + 100]
    out = torch.full((10,), 7, dtype=torch.uint8)
    ptr = out.data_ptr()
    got = staging.staging_for(torch.device("cpu")).gather(parts, out)
    assert got.data_ptr() == ptr
    assert out.tolist() == [0, 1, 2, 3, 4, 100, 101, 102, 7, 7]
    recv = torch.zeros(2, 8, dtype=torch.uint8)
    assert staging.staging_for("cpu").scatter(recv) is recv
    assert staging.staging_for("cpu").copies == 0


def test_staging_kinds():
    assert isinstance(staging.staging_for("cpu"), staging.HostStaging)
    assert isinstance(staging.staging_for("cuda:0"), staging.CudaStaging)  # built without touching CUDA
    with pytest.raises(ValueError, match="CPU or CUDA tensors only"):
        staging.staging_for("meta")
    assert isinstance(staging.cuda_aware_mpi(), bool)


class _Counting(staging.HostStaging):
    def __init__(self):
        self.gathers = self.scatters = 0

    def gather(self, parts, out):
        self.gathers += 1
        return super().gather(parts, out)

    def scatter(self, recv):
        self.scatters += 1
        return super().scatter(recv)


def test_fused_and_variable_layouts_go_through_the_staging(monkeypatch):
    counting = _Counting()
    monkeypatch.setattr(fusion, "staging_for", lambda device: counting)
    codec = get_codec("onebit")
    grads = {"a": torch.randn(6, 5), "b": torch.randn(17)}
    payloads = {k: codec.encode(g) for k, g in grads.items()}
    layout = FusedLayout(codec, [(k, g.shape, g.dtype) for k, g in grads.items()])
    buf = layout.pack(payloads)
    assert counting.gathers == 1  # one per bucket, whatever its tensor count
    stacked = dict(layout.unpack(buf.view(1, -1), {k: torch.device("cpu") for k in grads}))
    for k in grads:
        for name, b in payloads[k].buffers.items():
            assert torch.equal(stacked[k].buffers[name][0], b)
    part = pack_variable(list(grads), payloads)
    assert counting.gathers == 2
    back = unpack_variable(part, list(grads), payloads)
    for k in grads:
        for name, b in payloads[k].buffers.items():
            assert torch.equal(back[k].buffers[name], b)


@pytest.mark.requires_cuda
def test_cuda_staging_round_trip():
    st = staging.staging_for("cuda")
    parts = [torch.arange(9, dtype=torch.uint8, device="cuda"), torch.ones(7, dtype=torch.uint8, device="cuda")]
    out = torch.zeros(16, dtype=torch.uint8)
    st.gather(parts, out)
    assert out.tolist() == list(range(9)) + [1] * 7
    back = st.scatter(out.view(1, -1))
    assert back.is_cuda and torch.equal(back.cpu(), out.view(1, -1))
    assert st.copies == 2
