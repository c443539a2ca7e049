"""PyTorch DDP with the same codecs: ``state = hgc.ddp.register(ddp_model, "onebit", **options)``;
Adam with its momentum compressed: ``optimizer = hgc.ddp.onebit_adam(ddp_model, lr=...)``."""
from .gloo_exit import hold_backward_context, hold_latest, keep_until_exit
from .hook import DDPCompressionState, DDPExchangeError, register
from .local_hook import onebit_adam

__all__ = ["DDPCompressionState", "DDPExchangeError", "hold_backward_context", "hold_latest", "keep_until_exit",
           "onebit_adam", "register"]
