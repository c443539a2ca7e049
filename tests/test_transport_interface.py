"""The transport interface (horovod_gradcomp/transports/interface.py): every transport declares
it and defines each of its members itself, the transports import nothing from the layers above
them, and splitting a communicator goes through the transport's ``split``."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from horovod_gradcomp.exchange.topology import block_layout, can_split, sub_communicators
from horovod_gradcomp.transports import interface, mpi_lifetime
from horovod_gradcomp.transports.checks import group_of
from horovod_gradcomp.transports.horovod_ops import HorovodCommunicator
from horovod_gradcomp.transports.mpi import MPICommunicator
from horovod_gradcomp.transports.mpi import PollingComm
from horovod_gradcomp.transports.mpi_polling import PollingCommunicator
from horovod_gradcomp.transports.torch_dist import Pending, TorchDistributedCommunicator

PACKAGE = Path(interface.__file__).resolve().parents[1]


def protocol_members(protocol) -> set:
    """The methods and properties a protocol (and the protocols it extends) declares."""
    names = set()
    for klass in protocol.__mro__:
        if getattr(klass, "_is_protocol", False) and klass.__module__ == interface.__name__:
            names |= {n for n, v in vars(klass).items()
                      if not n.startswith("_") and (inspect.isfunction(v) or isinstance(v, property))}
    return names


def defined_by(cls, name: str) -> type:
    """The class of ``cls``'s MRO whose own namespace holds ``name``."""
    return next(k for k in cls.__mro__ if name in vars(k))


@pytest.mark.parametrize("cls, protocols", [
    (MPICommunicator, (interface.Communicator, interface.SplittableCommunicator, interface.DeviceBufferCommunicator)),
    (PollingCommunicator, (interface.Communicator, interface.SplittableCommunicator)),
    (HorovodCommunicator, (interface.Communicator,)),
    (TorchDistributedCommunicator, (interface.AsyncCommunicator, interface.SplittableCommunicator)),
    (Pending, (interface.PendingCollective,)),
])
def test_each_transport_declares_and_defines_its_protocols(cls, protocols):
    for protocol in protocols:
        assert protocol in cls.__mro__, f"{cls.__name__} does not declare {protocol.__name__}"
        members = protocol_members(protocol)
        assert members, protocol
        for name in sorted(members):
            owner = defined_by(cls, name)
            assert not getattr(owner, "_is_protocol", False), \
                f"{cls.__name__}.{name} is the stub of {owner.__name__}, not the transport's own"


def test_the_interface_lists_the_collectives_the_patterns_request():
    assert protocol_members(interface.Communicator) == {"rank", "size", *interface.COLLECTIVES}
    assert protocol_members(interface.AsyncCommunicator) - protocol_members(interface.Communicator) == {
        "allgather_async", "allgatherv_known_async", "alltoallv_async", "allreduce_max_async", "sizes_async"}
    assert interface.SplittableCommunicator not in HorovodCommunicator.__mro__


def _imports(path: Path):
    """(level, module) of every ``import``/``from ... import`` in a source file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            yield node.level, node.module or ""
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield 0, alias.name


def test_the_transports_import_nothing_from_the_layers_above():
    above = ("exchange", "ddp", "hvd_adapter", "training", "codecs", "state", "bench", "integrations", "optim")
    for path in sorted((PACKAGE / "transports").glob("*.py")) + [PACKAGE / "errors.py"]:
        for level, module in _imports(path):
            top = module.split(".")[0]
            absolute = module.startswith("horovod_gradcomp.") and module.split(".")[1] in above
            relative_up = level >= 2 and top in above
            assert not (absolute or relative_up), f"{path.relative_to(PACKAGE)} imports {'.' * level}{module}"


def test_group_of_checks_a_partition():
    assert group_of([[0, 2], [1, 3]], 3, 4) == (1, 1)
    assert group_of([[2, 0], [1, 3]], 0, 4) == (0, 1)    # the place in the listed order
    with pytest.raises(ValueError, match="do not partition the 4 ranks"):
        group_of([[0, 1], [1, 2, 3]], 0, 4)
    with pytest.raises(ValueError, match="do not partition the 3 ranks"):
        group_of([[0, 1]], 0, 3)


class _FakeMPI:
    """An mpi4py communicator's local calls and ``Split``, recorded."""

    def __init__(self, rank: int, size: int, splits: list):
        self.rank, self.size, self.splits = rank, size, splits

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's names
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.size

    def Split(self, color: int, key: int):  # noqa: N802
        self.splits.append((color, key))
        return _FakeMPI(key, 2, self.splits)

    def Iallgather(self, send, recv):  # noqa: N802 - (never called here)
        raise AssertionError("no collective expected")


def test_mpi_split_colours_by_group_and_keys_by_place():
    splits = []
    comm = MPICommunicator(comm=_FakeMPI(rank=3, size=4, splits=splits))
    layout = block_layout(4, 2, 3)   # nodes (0, 1) and (2, 3): rank 3 is node 1, local rank 1
    assert can_split(comm)
    node, peers = sub_communicators(comm, layout)
    assert splits == [(1, 1), (1, 1)]    # node: colour node 1, key local 1; peers: colour local 1, key node 1
    assert isinstance(node, MPICommunicator) and (node.rank, node.size) == (1, 2)
    assert isinstance(peers, MPICommunicator)


def test_a_polling_communicators_groups_poll_too():
    splits = []
    comm = MPICommunicator(comm=PollingComm(_FakeMPI(rank=0, size=2, splits=splits), 1e-4))
    sub = comm.split([[0], [1]])
    assert splits == [(0, 0)]
    assert isinstance(sub.connect(), PollingComm)


def test_a_transport_without_split_is_refused_by_name():
    class _Unsplittable:
        rank, size = 0, 4
    assert not can_split(_Unsplittable())
    with pytest.raises(TypeError, match="needs an mpi4py or torch.distributed communicator"):
        sub_communicators(_Unsplittable(), block_layout(4, 2, 0))


def test_exit_check_aborts_only_while_an_exchange_runs(monkeypatch):
    aborted = []
    monkeypatch.setattr(mpi_lifetime, "mpi_abort", aborted.append)
    busy = [False]
    monkeypatch.setattr(mpi_lifetime, "_BUSY", [])
    mpi_lifetime.abort_at_exit_while(lambda: busy[0])
    mpi_lifetime.abort_if_busy()
    assert aborted == []
    busy[0] = True
    mpi_lifetime.abort_if_busy()
    assert len(aborted) == 1 and "still inside an exchange" in aborted[0]


def test_torch_split_makes_a_group_per_listed_group(tmp_path):
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        comm = TorchDistributedCommunicator()
        sub = comm.split([[0]])
        assert isinstance(sub, TorchDistributedCommunicator) and sub.group is not comm.group
        assert (sub.rank, sub.size, sub.backend) == (0, 1, comm.backend)
        x = torch.arange(3, dtype=torch.uint8)
        assert torch.equal(sub.allgather(x), x.reshape(1, 3))
        with pytest.raises(ValueError, match="do not partition"):
            comm.split([[0], [1]])
    finally:
        dist.destroy_process_group()
