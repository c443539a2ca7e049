"""Lightning: ``CompressedDDPStrategy``, a ``DDPStrategy`` whose gradient exchange is a codec.

    import lightning as L
    from horovod_gradcomp.integrations.lightning import CompressedDDPStrategy

    trainer = L.Trainer(accelerator="cpu", devices=2,
                        strategy=CompressedDDPStrategy("onebit", codec_options={"pattern": "two_phase"}))
    trainer.fit(module, train_loader)
    print(trainer.strategy.compression_state.stats())   # bytes sent vs dense fp32

Why a strategy class rather than ``DDPStrategy(ddp_comm_hook=..., ddp_comm_state=...)``:

- ``DDPStrategy`` registers a comm hook only when the device is CUDA (Lightning 2.6,
  ``DDPStrategy._register_ddp_hooks``): on the CPU the hook is silently dropped and DDP's
  dense allreduce runs instead;
- the hook's state needs the DDP-wrapped model (parameter names, DDP's buckets) and an
  initialized process group, which exist only inside ``Trainer.fit``, after the strategy was
  built;
- Lightning writes checkpoints on rank 0 only, while the compression state (error-feedback
  residuals, DGC velocities, owner stripes) differs between ranks.

The strategy registers :func:`horovod_gradcomp.ddp.register` on the model it wraps (on any
device), calls the state's ``set_epoch`` at each training epoch (DGC's warm-up counts
epochs), puts every rank's compression state into each checkpoint under the key
``"hgc_compression"`` (``{"world_size": K, "ranks": [...]}``, gathered to rank 0), and when
``Trainer.fit(ckpt_path=...)`` resumes, loads each rank's own part back with the optimizer
state. Resuming needs the same number of ranks and the same codec (``ValueError`` otherwise);
a checkpoint without the key (e.g. from a dense run) starts the compression state fresh,
with a warning.
"""
from __future__ import annotations

from typing import Any, Mapping, Optional

from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from ..codecs import available_codecs
from ..ddp import register
from .job_state import gather_job_state, rank_part

CHECKPOINT_KEY = "hgc_compression"


class CompressedDDPStrategy(DDPStrategy):
    """``DDPStrategy`` with the gradient exchange of ``codec`` (see the module doc).

    Args:
        codec: a name of ``hgc.available_codecs()``.
        codec_options: keyword options of :func:`horovod_gradcomp.ddp.register` and the codec's
            factory, e.g. ``{"pattern": "two_phase"}``, ``{"density": 0.01}``,
            ``{"error_feedback": False}``. A dict, so that the remaining keyword arguments keep
            their ``DDPStrategy`` meaning (DDP's own, e.g. ``find_unused_parameters``).
        **kwargs: ``DDPStrategy``'s arguments, except the comm-hook ones
            (``ddp_comm_hook``, ``ddp_comm_state``, ``ddp_comm_wrapper``,
            ``model_averaging_period``), which this strategy replaces.

    After ``Trainer.fit`` has set up the model, :attr:`compression_state` is the hook's
    :class:`~horovod_gradcomp.ddp.DDPCompressionState` (``stats()``, ``state_dict()``).
    DGC keeps the momentum itself: it takes an SGD's momentum over, and runs without its
    momentum correction under Adam/AdamW (at the optimizer's first step).
    """

    def __init__(self, codec: str = "onebit", codec_options: Optional[Mapping[str, Any]] = None, **kwargs: Any):
        for key in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper", "model_averaging_period"):
            if kwargs.get(key) is not None:
                raise ValueError(f"CompressedDDPStrategy: {key}= conflicts with the codec's comm hook; for another "
                                 "hook use lightning's DDPStrategy (which registers hooks on CUDA only)")
        if codec not in available_codecs():
            raise ValueError(f"CompressedDDPStrategy: unknown codec {codec!r}; available: "
                             f"{', '.join(available_codecs())} (for DDP's dense allreduce use strategy='ddp')")
        super().__init__(**kwargs)
        self.codec = codec
        self.codec_options = dict(codec_options or {})
        self.compression_state = None
        self._epoch: Optional[int] = None

    def configure_ddp(self) -> None:
        """Wrap the module in DDP (as ``DDPStrategy``) and register the codec's hook on it."""
        super().configure_ddp()
        self.compression_state = register(self.model, self.codec, **self.codec_options)
        self._epoch = None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """Tell the compression the epoch at the first batch of each epoch (DGC's warm-up)."""
        super().on_train_batch_start(batch, batch_idx)
        epoch = self.lightning_module.trainer.current_epoch
        if self.compression_state is not None and epoch != self._epoch:
            self.compression_state.set_epoch(epoch)
            self._epoch = epoch

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Optional[Any] = None) -> None:
        """Add every rank's compression state under ``"hgc_compression"``, then write the file on
        rank 0 (as ``DDPStrategy``). Every rank calls it (as ``Trainer.save_checkpoint`` requires)."""
        if self.compression_state is not None:
            job = gather_job_state(self.compression_state)
            if job is not None:
                checkpoint = {**checkpoint, CHECKPOINT_KEY: job}
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Restore the optimizers (as ``DDPStrategy``) and this rank's compression state, when
        ``Trainer.fit(ckpt_path=...)`` resumes."""
        super().load_optimizer_state_dict(checkpoint)
        if self.compression_state is None:
            return
        job = checkpoint.get(CHECKPOINT_KEY)
        if job is None:
            rank_zero_warn(f"CompressedDDPStrategy: the checkpoint has no {CHECKPOINT_KEY!r} (written without a "
                           "codec?); the compression state (error feedback etc.) starts fresh")
            return
        self.compression_state.load_state_dict(rank_part(job, self.global_rank, self.world_size))
