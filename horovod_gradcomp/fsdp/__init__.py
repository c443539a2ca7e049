"""FSDP2: the codecs inside ``fully_shard``'s reduce-scatter (``hgc.fsdp.register``)."""
from .hsdp import HSDPCompressionState
from .register import register
from .state import FSDPCompressionState

__all__ = ["FSDPCompressionState", "HSDPCompressionState", "register"]
