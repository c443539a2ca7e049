"""The DDP comm hook (:func:`horovod_gradcomp.ddp.register`) under the launchers DDP users come from.

- :mod:`horovod_gradcomp.integrations.lightning`: ``CompressedDDPStrategy`` for
  ``lightning.Trainer(strategy=...)`` (needs ``lightning``);
- :mod:`horovod_gradcomp.integrations.lightning_fsdp`: ``CompressedModelParallelStrategy``, Lightning's
  FSDP2 strategy with :func:`horovod_gradcomp.fsdp.register` (needs ``lightning``);
- :mod:`horovod_gradcomp.integrations.accelerate`: ``register(accelerator, model, codec)`` on
  the model ``accelerator.prepare`` returned (needs ``accelerate``);
- :class:`JobCompressionState`: every rank's compression state as one object, for
  checkpoints that only rank 0 writes (both integrations use it).

The submodules import their framework; this package imports neither.
"""
from .job_state import JobCompressionState, gather_job_state, rank_part

__all__ = ["JobCompressionState", "gather_job_state", "rank_part"]
