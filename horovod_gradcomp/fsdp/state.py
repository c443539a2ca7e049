"""The state of sharded mode: the compression (codec, memory, step), the modules' reduce-scatters
and the counters; each module's call runs the compressed reduce-scatter job through the driver.

See :mod:`horovod_gradcomp.fsdp.register` for what a step is and where the memory lives.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from ..exchange.reduce_scatter import ShardLayout, dense_reduce_scatter_job, memory_keys, reduce_scatter_job
from ..exchange.stats import ExchangeStats
from ..exchange.step_ramp import apply_ramp, ramp_factor
from ..exchange.blocking_driver import BlockingDriver
from ..ddp.stall import process_watchdog
from ..state.compression_holder import CompressionHolder
from ..transports.torch_dist import TorchDistributedCommunicator
from .comm import CompressedReduceScatter


class FSDPCompressionState(CompressionHolder):
    """What :func:`register` returns: the compression (codec, memory, step) and its counters.

    Fields: compression (the ``hgc.Compression`` object whose codec and state are used),
    codec, communicator, comms (the modules' reduce-scatters, in model order), order (memory key ->
    stream index over every module's keys), timeout (the stall watchdog's deadline in seconds, 0:
    none; the compression's ``timeout=``, :func:`~horovod_gradcomp.exchange.watchdog.resolve_timeout`)."""

    mode = "sharded"

    def __init__(self, compression, communicator: TorchDistributedCommunicator):
        self.compression = compression
        self.codec = compression.codec
        self.communicator = communicator
        self.check_agreement = compression.engine.check_agreement   # checked a bool by the engine
        self.timeout = compression.engine.timeout
        self.comms: List[CompressedReduceScatter] = []
        self.order: Dict[str, int] = {}
        self.exchange_stats = ExchangeStats()
        self.calls = 0
        self.bytes_dense_reduce_scatter = 0.0
        self._seen: set = set()
        self.mesh = None   # the modules' DeviceMesh (register() sets it): the checkpoint's DTensors
        self.nodes = None  # [[the group's global ranks]] (register() sets it): the checkpoint's layout piece

    @property
    def memory(self):
        return self.compression.state.memory

    @property
    def step(self) -> int:
        return self.compression.state.step

    def add_module(self, name: str, layout: ShardLayout) -> CompressedReduceScatter:
        """A reduce-scatter for the module ``name`` with ``layout``; its keys join the stream order."""
        comm = CompressedReduceScatter(self, name, len(self.comms), layout)
        self.comms.append(comm)
        for key in memory_keys(layout):
            self.order[key] = len(self.order)
        return comm

    def _close_step(self) -> None:
        if self._seen:
            self._seen.clear()
            self.exchange_stats.steps += 1
            self.compression.state.end_step()

    def reduce_scatter(self, comm: CompressedReduceScatter, output_tensor: torch.Tensor, input_tensor: torch.Tensor,
                       group, scale: float, owner: str) -> None:
        """One module's reduce-scatter (called by :class:`CompressedReduceScatter`)."""
        if group is not None and group is not self.communicator.group and group.size() != self.communicator.size:
            raise ValueError(f"{owner}: FSDP reduces over a group of {group.size()} ranks, register() used one of "
                             f"{self.communicator.size}")
        if comm.index in self._seen:   # this module reduces again: the previous step is over
            self._close_step()
        step, layout, k = self.step, comm.layout, self.communicator.size
        dense = step < self.codec.warmup_steps
        signature = [f"hgc.fsdp module={comm.module!r}", f"world={k}", f"scale={scale!r}",
                     f"dtype={input_tensor.dtype}", f"step={step}", f"dense={dense}",
                     self.codec.agreement_key(), self.memory.agreement_key(),
                     *(f"{s.name}:{tuple(s.shape)}" for s in layout.segments)]
        common = dict(scale=scale, signature=signature, owner=owner, check=self.check_agreement,
                      stats=self.exchange_stats)
        if dense:
            job = dense_reduce_scatter_job(self.communicator, layout, input_tensor, output_tensor, **common)
        else:
            job = reduce_scatter_job(self.codec, self.memory, self.communicator, layout, input_tensor, output_tensor,
                                     step=step, order=self.order, **common)
        others = [r for r in range(k) if r != self.communicator.rank]
        what = (f"{owner}: step {step}, reduce-scatter on rank {self.communicator.rank} of {k}, waiting for ranks "
                f"{others}")
        with process_watchdog().guard(self.timeout, what):
            outcome = BlockingDriver(self.exchange_stats, threads_allowed=lambda c: False).run(job)
        if not outcome.nonfinite:
            apply_ramp([output_tensor], ramp_factor(self.codec.lr_warmup_steps, step))
        s = self.exchange_stats
        s.tensors += len(layout.segments)
        s.bytes_payload += outcome.payload
        s.bytes_payload_dense += 4 * layout.numel
        s.bytes_sent += outcome.sent
        s.bytes_sent_inter_node += outcome.sent
        s.nonfinite_steps += int(outcome.nonfinite)
        self.calls += 1
        self.bytes_dense_reduce_scatter += (k - 1) * layout.chunk_numel * input_tensor.element_size()
        self._seen.add(comm.index)
        if len(self._seen) == len(self.comms):
            self._close_step()

    def stats(self) -> dict:
        """This rank's cumulative counters: ``steps`` (backward passes that reduced), ``calls``
        (module reduce-scatters), ``bytes_sent`` (what this rank sent: preambles, shared scales,
        sizes and the payloads to the other owners; its own chunk is not counted),
        ``bytes_dense`` (what FSDP2's own reduce-scatter of the same inputs sends per rank in the
        reduce dtype, ``(K-1)/K`` of the input's bytes), their ratio ``wire_ratio``, per-step
        values, ``bytes_payload`` (all payloads this rank encoded, its own chunk included),
        ``nonfinite_steps`` (calls whose output was NaN), encode/exchange/decode seconds, and
        ``memory_bytes`` (:meth:`memory_bytes`)."""
        d = self.exchange_stats.as_dict()
        steps = self.exchange_stats.steps + (1 if self._seen else 0)
        d.update(steps=steps, calls=self.calls, bytes_dense=self.bytes_dense_reduce_scatter,
                 bytes_dense_per_step=self.bytes_dense_reduce_scatter / steps if steps else 0.0,
                 bytes_sent_per_step=self.exchange_stats.bytes_sent / steps if steps else 0.0,
                 wire_ratio=(self.bytes_dense_reduce_scatter / self.exchange_stats.bytes_sent
                             if self.exchange_stats.bytes_sent else None),
                 memory_bytes=self.memory_bytes(), padding_bytes=self.communicator.padding_bytes)
        return d

    def memory_bytes(self) -> int:
        """Bytes of this rank's compression state (residuals; DGC's velocities and accumulations;
        owner residuals, which the compressed reduce-scatter never makes: it decodes once)."""
        return self.compression.state.nbytes()

    def state_dict(self) -> dict:
        """This rank's compression state as DTensors over the modules' mesh, for ``dcp.save`` /
        ``dcp.load`` (a ``Stateful``; see :mod:`horovod_gradcomp.fsdp.checkpoint`). The per-rank
        dict of the Horovod path is ``state.compression.state_dict()``."""
        from .checkpoint import dcp_state_dict
        return dcp_state_dict(self)

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` (at the same world size; ``ValueError`` naming both sizes
        otherwise)."""
        from .checkpoint import load_dcp_state_dict
        load_dcp_state_dict(self, state)

    def __repr__(self) -> str:
        return (f"FSDPCompressionState({self.codec!r}, memory={self.memory!r}, modules={len(self.comms)}, "
                f"world={self.communicator.size})")
