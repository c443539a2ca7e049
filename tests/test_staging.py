"""exchange/staging.py: how fused payload bytes reach MPI from the device that encoded them.

The direct staging on the CPU (the host staging) makes no copy beyond the concatenation; the
exchange's pack/unpack go through it, and its counters say so. The choice between the direct
path, the CUDA host staging and the host staging is made without touching CUDA, so it is tested
here with ``cuda_aware_mpi`` replaced. The CUDA copies and events run only with a GPU (marked)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs import get_codec
from horovod_gradcomp.exchange import fusion, staging
from horovod_gradcomp.transports import mpi as mpi_transport
from horovod_gradcomp.transports.mpi import MPICommunicator
from horovod_gradcomp.exchange.fusion import FusedLayout, pack_variable, unpack_variable


def test_host_gather_writes_into_the_mpi_buffer_and_scatter_copies_nothing():
    host = staging.staging_for(torch.device("cpu"))
    before = host.counters()
    parts = [torch.arange(5, dtype=torch.uint8), torch.arange(3, dtype=torch.uint8) + 100]
    out = torch.full((10,), 7, dtype=torch.uint8)
    ptr = out.data_ptr()
    got = host.gather(parts, out)
    assert got.data_ptr() == ptr
    assert out.tolist() == [0, 1, 2, 3, 4, 100, 101, 102, 7, 7]
    recv = torch.zeros(2, 8, dtype=torch.uint8)
    assert staging.staging_for("cpu").scatter(recv) is recv
    after = host.counters()
    assert after["gathers"] - before["gathers"] == 1 and after["scatters"] - before["scatters"] == 1
    assert after["copies"] == before["copies"] == 0 and after["waits"] == before["waits"] == 0


def test_the_host_staging_is_the_direct_staging_on_the_cpu():
    host = staging.staging_for("cpu")
    assert isinstance(host, staging.HostStaging) and isinstance(host, staging.DirectStaging)
    assert host.device == host.wire_device == torch.device("cpu")
    buf = host.empty(12)
    assert buf.dtype == torch.uint8 and buf.shape == (12,) and buf.device.type == "cpu"


class _Aware:
    """A communicator that takes buffers on any CUDA device (what a CUDA-aware MPI declares)."""

    def takes_device_buffers(self, device):
        return torch.device(device).type in ("cpu", "cuda")


class _HostOnly:
    """A communicator without the declaration (Horovod's, torch.distributed's)."""


def test_staging_for_chooses_direct_only_when_the_communicator_takes_device_buffers(monkeypatch):
    monkeypatch.delenv(staging.HOST_STAGING_ENV, raising=False)
    assert isinstance(staging.staging_for("cuda:0"), staging.CudaStaging)   # built without touching CUDA
    assert isinstance(staging.staging_for("cuda:0", _HostOnly()), staging.CudaStaging)
    direct = staging.staging_for("cuda:0", _Aware())
    assert type(direct) is staging.DirectStaging and direct.wire_device == torch.device("cuda", 0)
    assert staging.staging_for("cuda:0", _Aware()) is direct      # one shared instance per kind and device
    assert staging.staging_for("cpu", _Aware()) is staging.staging_for("cpu")
    monkeypatch.setenv(staging.HOST_STAGING_ENV, "1")              # forced through the host
    assert isinstance(staging.staging_for("cuda:0", _Aware()), staging.CudaStaging)
    monkeypatch.setenv(staging.HOST_STAGING_ENV, "0")
    assert type(staging.staging_for("cuda:1", _Aware())) is staging.DirectStaging
    monkeypatch.setenv(staging.HOST_STAGING_ENV, "yes")
    with pytest.raises(ValueError, match="HOROVOD_GRADCOMP_HOST_STAGING must be 1"):
        staging.staging_for("cuda:0", _Aware())
    with pytest.raises(ValueError, match="CPU or CUDA tensors only"):
        staging.staging_for("meta")


def test_mpi_communicator_declares_device_buffers_from_cuda_aware_mpi(monkeypatch):
    monkeypatch.delenv(staging.HOST_STAGING_ENV, raising=False)
    comm = MPICommunicator(comm=object())   # no MPI call: the declaration is local
    assert comm.takes_device_buffers("cpu")
    monkeypatch.setattr(mpi_transport, "cuda_aware_mpi", lambda: False)
    assert not comm.takes_device_buffers("cuda:0")
    assert isinstance(staging.staging_for("cuda:0", comm), staging.CudaStaging)
    monkeypatch.setattr(mpi_transport, "cuda_aware_mpi", lambda: True)
    assert comm.takes_device_buffers("cuda:0")
    assert type(staging.staging_for("cuda:0", comm)) is staging.DirectStaging
    assert not comm.takes_device_buffers("meta")


def test_cuda_aware_mpi_answers_a_bool():
    assert isinstance(mpi_transport.cuda_aware_mpi(), bool)


def test_staging_into_follows_where_the_bytes_are():
    assert staging.staging_into("cpu", "cpu") is staging.staging_for("cpu")
    assert type(staging.staging_into("cuda:0", "cuda:0")) is staging.DirectStaging
    assert isinstance(staging.staging_into("cuda:0", "cpu"), staging.CudaStaging)
    with pytest.raises(ValueError, match="cannot be staged for payloads on cpu"):
        staging.staging_into("cpu", "cuda:0")
    with pytest.raises(ValueError, match="cannot be staged for payloads on cuda:1"):
        staging.staging_into("cuda:1", "cuda:0")


def test_direct_staging_refuses_buffers_elsewhere():
    direct = staging.DirectStaging("cpu")
    part = [torch.arange(4, dtype=torch.uint8)]
    with pytest.raises(ValueError, match="is on meta"):
        direct.gather(part, torch.empty(8, dtype=torch.uint8, device="meta"))
    with pytest.raises(ValueError, match="do not fit"):
        direct.gather(part, torch.empty(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="flat uint8"):
        direct.gather(part, torch.empty(8, dtype=torch.float32))
    with pytest.raises(ValueError, match="received bytes are on meta"):
        direct.scatter(torch.empty(2, 4, dtype=torch.uint8, device="meta"))
    with pytest.raises(ValueError, match="CPU or CUDA only"):
        staging.DirectStaging("meta")
    assert direct.counters() == {"gathers": 0, "scatters": 0, "copies": 0, "waits": 0}


def _payloads():
    codec = get_codec("onebit")
    grads = {"a": torch.randn(6, 5), "b": torch.randn(17)}
    return codec, grads, {k: codec.encode(g) for k, g in grads.items()}


def test_fused_and_variable_layouts_go_through_the_staging(monkeypatch):
    counting = staging.DirectStaging("cpu")    # the direct path's data path, over CPU tensors
    seen = []
    monkeypatch.setattr(fusion, "staging_for", lambda device, comm=None: seen.append((device, comm)) or counting)
    monkeypatch.setattr(fusion, "staging_into", lambda device, wire: counting)
    codec, grads, payloads = _payloads()
    comm = _Aware()
    layout = FusedLayout(codec, [(k, g.shape, g.dtype) for k, g in grads.items()])
    buf = layout.pack(payloads, comm=comm)
    assert counting.gathers == 1 and seen == [(torch.device("cpu"), comm)]   # one per bucket, with its comm
    stacked = dict(layout.unpack(buf.view(1, -1), {k: torch.device("cpu") for k in grads}))
    assert counting.scatters == 1
    for k in grads:
        for name, b in payloads[k].buffers.items():
            assert torch.equal(stacked[k].buffers[name][0], b)
    part = pack_variable(list(grads), payloads, comm)
    assert counting.gathers == 2 and seen[-1][1] is comm
    back = unpack_variable(part, list(grads), payloads)
    for k in grads:
        for name, b in payloads[k].buffers.items():
            assert torch.equal(back[k].buffers[name], b)
    assert counting.copies == 0 and counting.waits == 0


def test_pack_into_a_given_buffer_and_an_empty_layout():
    codec, grads, payloads = _payloads()
    layout = FusedLayout(codec, [(k, g.shape, g.dtype) for k, g in grads.items()])
    out = torch.full((layout.nbytes + 4,), 9, dtype=torch.uint8)
    packed = layout.pack(payloads, out=out[:layout.nbytes])
    assert packed.data_ptr() == out.data_ptr() and out[layout.nbytes:].tolist() == [9] * 4
    assert torch.equal(packed, layout.pack(payloads))
    empty = FusedLayout(codec, [])
    assert empty.nbytes == 0 and empty.pack({}).numel() == 0
    given = torch.empty(0, dtype=torch.uint8, device="meta")   # no bytes: nothing is staged, any buffer will do
    assert empty.pack({}, out=given) is given


def test_a_cpu_exchange_runs_the_direct_path_without_copies():
    """A whole step through the engine and both layouts: every pack and unpack through the
    direct staging on the CPU, no copy."""
    host = staging.staging_for("cpu")
    before = host.counters()

    class OneRank:
        rank, size, thread_multiple = 0, 1, True

        def allgather(self, send):
            return send.reshape(1, -1).clone()

        def allgatherv(self, send):
            return [send.clone()]

    named = [("w", torch.nn.Parameter(torch.zeros(40, 7))), ("b", torch.nn.Parameter(torch.zeros(9)))]
    for codec, opts in (("onebit", {}), ("qsgd", {"coding": "elias"})):
        comp = hgc.Compression.codec(codec, named, communicator=OneRank(), **opts)
        out = comp.exchange({"w": torch.randn(40, 7), "b": torch.randn(9)})
        assert all(r.device.type == "cpu" and torch.isfinite(r).all() for r in out.values())
    after = host.counters()
    assert after["gathers"] - before["gathers"] >= 2 and after["scatters"] - before["scatters"] >= 2
    assert after["copies"] == before["copies"] == 0


def test_communicator_refuses_buffers_mpi_cannot_take(monkeypatch):
    monkeypatch.setattr(mpi_transport, "cuda_aware_mpi", lambda: False)
    comm = MPICommunicator(comm=object())
    with pytest.raises(TypeError, match="does not take buffers on meta"):
        comm.allgather(torch.empty(4, dtype=torch.uint8, device="meta"))
    with pytest.raises(TypeError, match="flat uint8 tensor"):
        comm.allgatherv(torch.empty(4, dtype=torch.float32))
    with pytest.raises(TypeError, match="flat uint8 tensor"):
        comm.alltoallv(torch.empty(2, 2, dtype=torch.uint8), [2], [2])
    with pytest.raises(TypeError, match="does not take buffers"):
        comm.allgatherv_known(torch.empty(4, dtype=torch.uint8, device="meta"), [4])


class _Loopback:
    """The mpi4py calls of a one-rank MPICommunicator, copying send into recv (numpy views)."""

    def Get_rank(self):  # noqa: N802 - mpi4py's names
        return 0

    def Get_size(self):  # noqa: N802
        return 1

    def Allgather(self, send, recv):  # noqa: N802
        np.copyto(recv[0].reshape(-1), send[0].reshape(-1))

    def Allgatherv(self, send, recv):  # noqa: N802
        np.copyto(recv[0][:send[0].size], send[0])

    def Alltoallv(self, send, recv):  # noqa: N802
        np.copyto(recv[0], send[0])


def test_receive_buffers_follow_the_send_buffer():
    comm = MPICommunicator(comm=_Loopback())
    x = torch.arange(6, dtype=torch.uint8)
    assert torch.equal(comm.allgather(x), x.view(1, -1))
    assert torch.equal(comm.allgatherv(x)[0], x)
    assert torch.equal(comm.allgatherv_known(x, [6])[0], x)
    assert torch.equal(comm.alltoallv(x, [6], [6]), x)


@pytest.mark.requires_cuda
def test_cuda_staging_round_trip():
    st = staging.staging_for("cuda")
    parts = [torch.arange(9, dtype=torch.uint8, device="cuda"), torch.ones(7, dtype=torch.uint8, device="cuda")]
    out = st.empty(16)
    assert out.is_pinned()
    st.gather(parts, out)
    assert out.tolist() == list(range(9)) + [1] * 7
    back = st.scatter(out.view(1, -1))
    assert back.is_cuda and torch.equal(back.cpu(), out.view(1, -1))
    assert st.copies >= 2


@pytest.mark.requires_cuda
def test_direct_staging_on_cuda_keeps_the_bytes_on_the_device():
    st = staging.DirectStaging(torch.device("cuda", torch.cuda.current_device()))
    parts = [torch.arange(9, dtype=torch.uint8, device="cuda"), torch.ones(7, dtype=torch.uint8, device="cuda")]
    out = st.empty(16)
    assert out.is_cuda
    st.gather(parts, out)
    assert out.cpu().tolist() == list(range(9)) + [1] * 7
    assert st.scatter(out.view(1, -1)) is not None and st.copies == 0 and st.waits == 1
