"""When importing horovod_gradcomp initializes MPI (single process; the launched case, and why,
is tests/test_horovod_contract_launch.py::test_another_ranks_exit_does_not_finalize_mpi_under_this_one)."""
from __future__ import annotations

import multiprocessing

import pytest

from horovod_gradcomp.transports import mpi_lifetime


@pytest.fixture
def no_launcher(monkeypatch):
    for var in mpi_lifetime.LAUNCHER_ENV:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delenv(mpi_lifetime.ENV_VAR, raising=False)
    return monkeypatch


def test_nothing_outside_an_mpi_launcher(no_launcher):
    assert not mpi_lifetime.launched_by_mpi()
    assert mpi_lifetime.initialize_mpi_before_horovod() == "no launcher"


def test_switched_off_by_the_environment(no_launcher):
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")
    no_launcher.setenv(mpi_lifetime.ENV_VAR, "0")
    assert mpi_lifetime.launched_by_mpi()
    assert mpi_lifetime.initialize_mpi_before_horovod() == "off"


def _child(queue):
    queue.put(mpi_lifetime.initialize_mpi_before_horovod())


def test_a_ranks_spawned_children_do_not_initialize(no_launcher):
    no_launcher.setenv("OMPI_COMM_WORLD_SIZE", "2")  # inherited by the child, as from mpirun
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child, args=(queue,))
    proc.start()
    try:
        assert queue.get(timeout=120) == "child process"
    finally:
        proc.join(timeout=60)
