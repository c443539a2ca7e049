"""Lightning: ``CompressedModelParallelStrategy``, FSDP2 (``ModelParallelStrategy``) with a codec.

    import lightning as L
    from horovod_gradcomp.integrations.lightning_fsdp import CompressedModelParallelStrategy

    class Model(L.LightningModule):
        def configure_model(self):                      # as ModelParallelStrategy asks
            for block in self.blocks:
                fully_shard(block, mesh=self.device_mesh["data_parallel"])
            fully_shard(self, mesh=self.device_mesh["data_parallel"])

    strategy = CompressedModelParallelStrategy("onebit", data_parallel_size=2, tensor_parallel_size=1)
    L.Trainer(accelerator="cpu", devices=2, strategy=strategy).fit(Model(), loader)
    print(strategy.compression_state.stats())

After Lightning's own setup (``configure_model``, the optimizers) the strategy calls
:func:`horovod_gradcomp.fsdp.register` on the model with the first optimizer: sharded mode when the
modules are sharded over every rank (``tensor_parallel_size=1``), HSDP mode when over a smaller
1-D mesh. Checkpoints (``save_distributed_checkpoint=True``, the default and the only one taken):
Lightning writes its distributed checkpoint directory, and the strategy writes the compression state
beside it with ``torch.distributed.checkpoint`` into ``<dir>/hgc_compression`` (either mode's
``Stateful``: :mod:`horovod_gradcomp.fsdp.checkpoint`, :mod:`horovod_gradcomp.fsdp.hsdp_checkpoint`);
``Trainer.fit(ckpt_path=...)`` loads it back after the model and optimizers (same world size; another is refused naming both sizes). A checkpoint
without it starts the compression state fresh, with a warning.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

import torch.distributed.checkpoint as dcp
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from ..codecs import available_codecs
from ..fsdp import register

#: The subdirectory of a Lightning distributed checkpoint that holds the compression state.
CHECKPOINT_DIR = "hgc_compression"


class CompressedModelParallelStrategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` (FSDP2) whose reduce-scatters go through ``codec`` (see the module doc).

    Args:
        codec: a name of ``hgc.available_codecs()``.
        codec_options: keyword options of :func:`horovod_gradcomp.fsdp.register` (``mode``,
            ``residual_dtype``, the codec's options).
        **kwargs: ``ModelParallelStrategy``'s (``data_parallel_size``, ``tensor_parallel_size``, ...).

    :attr:`compression_state` is what ``register`` returned, once ``Trainer.fit`` set the model up."""

    def __init__(self, codec: str = "onebit", codec_options: Optional[Mapping[str, Any]] = None, **kwargs: Any):
        if codec not in available_codecs():
            raise ValueError(f"CompressedModelParallelStrategy: unknown codec {codec!r}; available: "
                             f"{', '.join(available_codecs())} (for FSDP2's dense reduce-scatter use "
                             "ModelParallelStrategy)")
        if kwargs.get("save_distributed_checkpoint") is False:
            raise ValueError("CompressedModelParallelStrategy: save_distributed_checkpoint=False writes one file from "
                             "rank 0, but the compression state differs between ranks: keep the distributed checkpoint")
        super().__init__(**kwargs)
        self.codec = codec
        self.codec_options = dict(codec_options or {})
        self.compression_state = None

    def setup(self, trainer) -> None:
        """Lightning's setup (the model sharded in ``configure_model``, the optimizers), then the codec."""
        super().setup(trainer)
        if self.compression_state is None:
            optimizer = self.optimizers[0] if len(self.optimizers) == 1 else None
            self.compression_state = register(self.model, self.codec, optimizer=optimizer, **self.codec_options)

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options: Optional[Any] = None) -> None:
        """Lightning's distributed checkpoint, then the compression state in ``<dir>/hgc_compression``."""
        super().save_checkpoint(checkpoint, filepath, storage_options=storage_options)
        if self.compression_state is not None:
            path = Path(self.broadcast(filepath)) / CHECKPOINT_DIR
            dcp.save({"compression": self.compression_state}, checkpoint_id=path)

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> dict:
        """Lightning's load (model, optimizers), then the compression state when the checkpoint has it."""
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        if self.compression_state is not None:
            path = Path(self.broadcast(checkpoint_path)) / CHECKPOINT_DIR
            if path.is_dir():
                dcp.load({"compression": self.compression_state}, checkpoint_id=path)
            else:
                rank_zero_warn(f"CompressedModelParallelStrategy: {path} does not exist (a checkpoint written without "
                               "a codec?); the compression state starts fresh")
        return checkpoint
