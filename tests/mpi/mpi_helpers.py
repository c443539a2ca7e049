"""Shared pieces of the suites that run under mpirun (files named mpi_*.py: the plain
``pytest tests`` run does not collect them; tests/test_mpi_suites.py launches them)."""
from __future__ import annotations

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc


def init():
    """Initialize Horovod once per process; return (rank, size)."""
    if not hvd.is_initialized():
        hvd.init()
    return hvd.rank(), hvd.size()


needs_peers = pytest.mark.skipif(  # evaluated identically on every rank
    init()[1] < 2, reason="Horovod registers its gradient hooks only when hvd.size() > 1")


def init_gloo(tag: str) -> None:
    """torch.distributed on gloo over the mpirun ranks (once per process): rank 0 picks a free
    port, Horovod broadcasts it (``tag`` names that broadcast)."""
    import os
    import socket
    import torch.distributed as dist
    if dist.is_initialized():
        return
    rank, size = init()
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    port = hvd.broadcast_object(port, root_rank=0, name=f"hgc.test.{tag}.port")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=size)


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def assert_identical_across_ranks(model: torch.nn.Module) -> None:
    """Every rank's parameters are bitwise equal to rank 0's."""
    mine = flat_params(model)
    every = hvd.allgather(mine.unsqueeze(0))
    for r in range(every.shape[0]):
        assert torch.equal(every[r], every[0]), f"rank {r}'s parameters differ from rank 0's"


def gather_tensors(t: torch.Tensor) -> torch.Tensor:
    """[K, *t.shape]: every rank's t (through Horovod, independently of the codec exchange)."""
    return hvd.allgather(t.detach().unsqueeze(0).contiguous())


def reference_mean_of_decoded(codec_ref, compensated: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """From every rank's compensated gradient (g + r_old), compute with the pure-torch
    reference codec: (mean over ranks of decode(encode(v_k)), this rank's new residual)."""
    every = gather_tensors(compensated)
    decoded = [codec_ref.decode(codec_ref.encode(every[k].clone())) for k in range(every.shape[0])]
    mine = compensated - codec_ref.decode(codec_ref.encode(compensated.clone()))
    return torch.stack(decoded).to(torch.float64).mean(0).to(compensated.dtype), mine


def two_phase_exchange(pattern, names, grads, state, order, outs=None):
    """One bucket through ``pattern`` (a TwoPhasePattern) on the default communicator, at
    ``state.step``: ``(results, info)``."""
    from horovod_gradcomp.transports import default_communicator
    from horovod_gradcomp.exchange.blocking_driver import BlockingDriver
    from horovod_gradcomp.exchange.bucket import Bucket
    from horovod_gradcomp.exchange.stats import ExchangeStats, StepTotals
    stats = ExchangeStats()
    outcome = BlockingDriver(stats).run(pattern.steps(default_communicator(), Bucket(list(names), grads, state, order,
                                                                                     outs or {}), stats, StepTotals()))
    return outcome.results, outcome.info


def fresh_state(error_feedback: bool = True):
    """A CompressionState with an error-feedback memory (enabled or not) at step 0."""
    from horovod_gradcomp.state import CompressionState, ErrorFeedback
    return CompressionState(ErrorFeedback(enabled=error_feedback))


def assert_alltoallv_uneven(comm) -> None:
    """``comm.alltoallv`` with rank-dependent sizes, some zero: rank r sends (r + j) % 3 bytes of
    value 10 r + j to rank j, and receives what every rank sent it, in rank order."""
    rank, size = comm.rank, comm.size
    send_counts = [(rank + j) % 3 for j in range(size)]
    send = torch.cat([torch.full((c,), 10 * rank + j, dtype=torch.uint8) for j, c in enumerate(send_counts)])
    recv_counts = [(j + rank) % 3 for j in range(size)]
    recv = comm.alltoallv(send, send_counts, recv_counts)
    expect = torch.cat([torch.full((c,), 10 * j + rank, dtype=torch.uint8) for j, c in enumerate(recv_counts)])
    assert torch.equal(recv, expect)



def onebit_unramped(named_parameters, **options):
    """``hgc.Compression.onebit`` without the opt-in gradient warm-up (``lr_warmup_steps=0``, the
    default, said explicitly): the exchange's own arithmetic, for tests that check it against the
    reference codec step by step (the warm-up is tested on its own in mpi_onebit_warmup.py). No
    residual cap unless given (``residual_cap=0``, said explicitly: under SGD the default is 0.05,
    and the cap is tested on its own in mpi_onebit_residual_cap.py)."""
    options.setdefault("residual_cap", 0.0)
    return hgc.Compression.onebit(named_parameters, lr_warmup_steps=0, **options)


class LocalGradients:
    """Each backward pass's own gradients of ``named`` parameters, cloned as autograd produces
    them: a tensor hook runs before the parameter's AccumulateGrad node, so before the hooks
    through which Horovod starts the exchange. (Reading ``p.grad`` between ``backward()`` and
    ``synchronize()`` races with that exchange, which may already have written the result into
    it: stock Horovod's in-place allreduce does the same.)"""

    def __init__(self, named):
        self._params = [(n, p) for n, p in named]
        self._seen: dict = {}
        self._handles = [p.register_hook(self._keeper(n)) for n, p in self._params if p.requires_grad]

    def _keeper(self, name):
        def keep(grad):
            self._seen[name] = grad.detach().clone() + self._seen.get(name, 0)
        return keep

    def take(self) -> dict:
        """The gradients since the last call, summed over the backward passes (zeros for a
        parameter that got none); starts afresh."""
        out = {n: self._seen.get(n, torch.zeros_like(p)) for n, p in self._params}
        self._seen = {}
        return out

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
