"""PyTorch DDP with the same codecs: ``state = hgc.ddp.register(ddp_model, "onebit", **options)``."""
from .hook import DDPCompressionState, DDPExchangeError, register

__all__ = ["DDPCompressionState", "DDPExchangeError", "register"]
