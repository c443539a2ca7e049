"""Horovod elastic: the compression's state in ``hvd.elastic.TorchState``.

``hgc.elastic.TorchState(model, optimizer, compression=compression, **kw)`` is
``hvd.elastic.TorchState`` with a handler for the compression registered first (through
Horovod's public ``set_handler_registry``; :func:`register_handler` does only that, after
which plain ``hvd.elastic.TorchState(..., compression=compression)`` works too). The
compression must run on Horovod's collectives (``transport="auto"`` does so under
``horovodrun --gloo``; elastic needs Gloo).

What happens to the compression's state:

* ``state.commit()`` (save): a copy of this rank's memory (error-feedback residuals or DGC
  velocity/accumulation and counters), its two-phase owner residuals and the step counter.
* restore (after a failed collective): this rank's last copy comes back; the step that was
  in flight is dropped (its gradients and partial results are discarded).
* sync (after every reset, on every rank, and at the start): the exchange starts over on
  the new membership. The collective names restart from zero on every rank; the step
  counter (random-stream positions) and DGC's warm-up counters come from rank 0; the
  stochastic codecs' ``rank_stream`` becomes the new rank; two-phase plans are rebuilt for
  the new K on the next step (they are keyed by K).
* Residuals are per rank and are never broadcast: a surviving rank keeps its worker
  residuals (and DGC memory), a rank that joins starts from zero, and the residual of a rank
  that left is lost (that gradient mass is never applied, as when a rank's last update is
  dropped). Two-phase owner residuals belong to stripes of the old K and are discarded on
  every membership change.
"""
from __future__ import annotations

import copy

from .hvd_adapter.compression import CodecCompression
from .transports.horovod_ops import HorovodCommunicator


def _handler_class():
    from horovod.torch.elastic.state import StateHandler

    class CompressionStateHandler(StateHandler):
        """Save / restore / sync of one :class:`CodecCompression` (see the module doc)."""

        def __init__(self, compression: CodecCompression):
            if not isinstance(compression.communicator, HorovodCommunicator):
                raise ValueError("hgc.elastic: the compression must exchange through Horovod's collectives "
                                 f"(transport='horovod' or 'auto' under horovodrun --gloo), got {compression.communicator!r}")
            super().__init__(compression)
            self._size = None
            self.save()

        def save(self):
            self._saved = _snapshot(self.value)

        def restore(self):
            _abort_step(self.value)
            _load(self.value, self._saved)

        def sync(self):
            import horovod.torch as hvd
            comp = self.value
            _abort_step(comp)
            comp.communicator.restart()
            size = comp.communicator.size
            if self._size is not None and size != self._size:
                comp.state.owner_memory.residuals.clear()
            self._size = size
            if comp.codec.rank_stream is not None:
                comp.codec.rank_stream = comp.communicator.rank
            counters = hvd.broadcast_object({"step": comp.state.step, "memory": comp.memory.clock()}, root_rank=0,
                                            name="hgc.elastic.counters")
            comp.state.step = counters["step"]
            comp.memory.set_clock(counters["memory"])
            self.save()

    return CompressionStateHandler


def _snapshot(comp: CodecCompression) -> dict:
    return copy.deepcopy(comp.state.state_dict())


def _load(comp: CodecCompression, saved: dict) -> None:
    comp.state.load_state_dict(copy.deepcopy(saved))


def _abort_step(comp: CodecCompression) -> None:
    """Forget a step interrupted by a failed collective (gradients, partial results, totals)."""
    comp.abort_step()


def register_handler() -> None:
    """Make ``hvd.elastic.TorchState`` handle :class:`CodecCompression` keyword arguments (idempotent)."""
    from horovod.torch.elastic import state as hvd_state
    registry = hvd_state.get_handler_registry()
    if not any(cls is CodecCompression for cls, _ in registry):
        hvd_state.set_handler_registry(list(registry) + [(CodecCompression, _handler_class())])


def TorchState(model=None, optimizer=None, **kwargs):  # noqa: N802 (mirrors hvd.elastic.TorchState)
    """``hvd.elastic.TorchState(model, optimizer, **kwargs)`` after :func:`register_handler`:
    pass the compression as a keyword (``compression=compression``)."""
    import horovod.torch as hvd
    register_handler()
    return hvd.elastic.TorchState(model, optimizer, **kwargs)
