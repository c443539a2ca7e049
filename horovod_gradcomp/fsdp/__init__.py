"""FSDP2: the codecs inside ``fully_shard``'s reduce-scatter (``hgc.fsdp.register``)."""
from .register import FSDPCompressionState, register

__all__ = ["FSDPCompressionState", "register"]
