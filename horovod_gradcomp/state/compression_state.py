"""Everything a compression object saves between steps, on this rank, owned in one place.

:class:`CompressionState` holds

* ``memory``: the worker memory that turns a gradient into a payload: error-feedback residuals
  (:class:`~horovod_gradcomp.state.error_feedback.ErrorFeedback`) or DGC's velocity,
  accumulation and warm-up clock (:class:`~horovod_gradcomp.state.dgc_memory.DGCMemory`),
  keyed by parameter name;
* ``owner_memory``: the two-phase pattern's owner residuals (the stripes this rank owns and
  requantizes, keyed ``f"{name}[{rank}]"``), enabled iff the worker memory keeps residuals
  and backs the two-phase stripes (error feedback, on);
* ``step``: exchanges completed, which positions every stochastic codec's random stream.

Any memory implements :class:`~horovod_gradcomp.state.memory.Memory`. The exchange reads and
updates them only through their methods; ``state_dict()`` saves them
all. The state is this rank's: residuals differ between ranks, and so do owner stripes.
"""
from __future__ import annotations

from .error_feedback import ErrorFeedback
from .memory import Memory


class CompressionState:
    """The per-rank state of one compression object (see the module doc).

    Fields:
        memory: worker memory (error feedback or DGC), keyed by parameter name.
        owner_memory: two-phase owner residuals (error feedback of the owned stripes).
        step: exchanges completed on this rank (the same on every rank).
    """

    def __init__(self, memory: Memory):
        self.memory = memory
        self.owner_memory = ErrorFeedback(enabled=memory.supports_owner_stripes and memory.keeps_residuals)
        self.step = 0

    def end_step(self) -> None:
        """Close one exchange: advance the step and the memory's own clock."""
        self.step += 1
        self.memory.end_step()

    def snapshot(self, names, owner_keys) -> tuple:
        """Copies of the worker memory of ``names`` and of the owner residuals ``owner_keys``:
        what an exchange of those tensors may change (for :meth:`restore` after a skipped step)."""
        return self.memory.snapshot(names), self.owner_memory.snapshot(owner_keys)

    def restore(self, snapshot: tuple) -> None:
        """Undo the exchange that followed :meth:`snapshot` (a step skipped for non-finite values)."""
        worker, owner = snapshot
        self.memory.restore(worker)
        self.owner_memory.restore(owner)

    def nbytes(self) -> int:
        """Bytes of every tensor this state holds between steps: the worker memory's stores
        (residuals; DGC's velocities and accumulations) and the owner residuals (:meth:`owner_nbytes`)."""
        return _store_bytes(self.memory) + self.owner_nbytes()

    def owner_nbytes(self) -> int:
        """Bytes of the owner residuals alone (a two-phase owner's; none elsewhere)."""
        return _store_bytes(self.owner_memory)

    def state_dict(self) -> dict:
        """Copies of everything above (tensors cloned: the live state is updated in place)."""
        return {"memory": repr(self.memory), "memory_state": self.memory.state_dict(),
                "owner_memory": self.owner_memory.state_dict(), "step": self.step}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (raises ``ValueError`` when the memory's options differ)."""
        if state.get("memory") != repr(self.memory):
            raise ValueError(f"checkpoint was written with {state.get('memory')}, this compression has "
                             f"{self.memory!r}")
        self.memory.load_state_dict(state["memory_state"])
        self.owner_memory.load_state_dict(state["owner_memory"])
        self.step = int(state["step"])

    def __repr__(self) -> str:
        return f"CompressionState(memory={self.memory!r}, step={self.step})"


def _store_bytes(memory) -> int:
    """Bytes of every tensor in ``memory``'s stores."""
    return sum(t.numel() * t.element_size() for store in memory.stores().values() for t in store.values())
