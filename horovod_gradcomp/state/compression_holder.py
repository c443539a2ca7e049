"""What the DDP and FSDP states share: they wrap an ``hgc.Compression`` and pass its checkpoint
and epoch through unchanged."""
from __future__ import annotations


class CompressionHolder:
    """Base of an object holding a compression as ``self.compression``: ``state_dict``,
    ``load_state_dict`` and ``set_epoch`` are the compression's own."""

    compression: object

    def state_dict(self) -> dict:
        return self.compression.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.compression.load_state_dict(state)

    def set_epoch(self, epoch: int) -> None:
        self.compression.set_epoch(epoch)
