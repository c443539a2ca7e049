"""Single-process checks of the transport rule and of the torch.distributed communicator
(a gloo world of one in this process); the multi-rank behaviour is tested under mpirun
(tests/mpi/mpi_transports.py, mpi_ddp.py) and by the launchers (test_transport_launch.py)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed as dist

import horovod_gradcomp as hgc
from horovod_gradcomp.errors import ExchangeMismatchError
from horovod_gradcomp.transports.mpi import MPICommunicator
from horovod_gradcomp.exchange.blocking_driver import BlockingDriver
from horovod_gradcomp.exchange.preamble import preamble_steps
from horovod_gradcomp.exchange.stats import ExchangeStats
from horovod_gradcomp.transports import select_communicator
from horovod_gradcomp.transports.torch_dist import TorchDistributedCommunicator


def bucket_preamble(comm, *args):
    """The preamble's request sequence run at once (the blocking driver, collectives on this thread)."""
    return BlockingDriver(ExchangeStats()).run(preamble_steps(comm, *args))


def test_rule_without_horovod(monkeypatch):
    hvd = pytest.importorskip("horovod.torch")
    if hvd.is_initialized():
        pytest.skip("Horovod already initialized in this process")
    for var in ("HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_HOSTNAME"):
        monkeypatch.delenv(var, raising=False)
    assert isinstance(select_communicator("auto"), MPICommunicator)
    with pytest.raises(ValueError, match="transport must be one of"):
        select_communicator("gloo")
    with pytest.raises(RuntimeError, match="hvd.init"):
        select_communicator("horovod")
    with pytest.raises(RuntimeError, match="process_set given"):
        select_communicator("auto", process_set=object())
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_HOSTNAME", "localhost")
    with pytest.raises(RuntimeError, match="launched by horovodrun with Gloo"):
        hgc.Compression.onebit([("w", torch.nn.Parameter(torch.zeros(3)))])


@pytest.fixture
def gloo_world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_torch_dist_communicator_world_of_one(gloo_world_of_one):
    comm = TorchDistributedCommunicator()
    assert (comm.rank, comm.size) == (0, 1)
    x = torch.arange(5, dtype=torch.uint8)
    assert torch.equal(comm.allgather(x), x.reshape(1, 5))
    assert torch.equal(comm.allgatherv(x)[0], x)
    assert torch.equal(comm.allgatherv_known(x, [5])[0], x)
    assert torch.equal(comm.alltoallv(x, [5], [5]), x)
    assert np.array_equal(comm.allreduce_max(np.array([1.5, -2.0])), [1.5, -2.0])
    assert bucket_preamble(comm, "same", ["a"], True) is True
    with pytest.raises(TypeError, match="flat uint8"):
        comm.allgather(x.float())
    with pytest.raises(ValueError, match="counts say"):
        comm.allgatherv_known(x, [4])
    assert isinstance(ExchangeMismatchError("x"), RuntimeError)


def test_ddp_register_world_of_one(gloo_world_of_one):
    """With one rank the hook's result is the codec's own decode of g + r (error feedback), not
    rescaled (onebit's defaults)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = hgc.ddp.register(ddp, "onebit")
    ref = hgc.get_codec("onebit", impl="reference")
    residual = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    plain = [p.detach().clone() for p in model.parameters()]
    for step in range(2):
        x = torch.randn(8, 4, generator=torch.Generator().manual_seed(step))
        ddp.zero_grad()
        ddp(x).square().sum().backward()
        copy = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
        with torch.no_grad():
            for q, p in zip(copy.parameters(), plain):
                q.copy_(p)
        copy(x).square().sum().backward()
        for (n, p), q in zip(model.named_parameters(), copy.parameters()):
            v = q.grad + residual[n]
            want = ref.decode(ref.encode(v.clone()))
            residual[n] = v - want
            torch.testing.assert_close(p.grad, want, rtol=1e-6, atol=1e-6)
    assert state.stats()["steps"] == 2
    assert set(state.state_dict()["memory_state"]["residuals"]) == {n for n, _ in model.named_parameters()}
