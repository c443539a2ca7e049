"""Training-loop tools: the double-buffered half-minibatch step, minibatch-size selection, and the
averaging and asynchronous schemes (:mod:`horovod_gradcomp.training.schemes`)."""
from .double_buffering import DoubleBufferedStep, double_buffering_pays
from .minibatch import select_minibatch_size

__all__ = ["DoubleBufferedStep", "double_buffering_pays", "select_minibatch_size"]
