"""PyTorch DDP with the same codecs: ``state = hgc.ddp.register(ddp_model, "onebit", **options)``."""
from .gloo_exit import hold_backward_context, hold_latest, keep_until_exit
from .hook import DDPCompressionState, DDPExchangeError, register

__all__ = ["DDPCompressionState", "DDPExchangeError", "hold_backward_context", "hold_latest", "keep_until_exit",
           "register"]
