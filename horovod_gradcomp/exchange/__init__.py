"""The exchange: the step engine and the patterns it runs (allgather, two-phase, dense,
hierarchical), with the buckets, plans, stripes, fusion, staging and statistics they use. The
bytes travel through a transport (:mod:`horovod_gradcomp.transports`)."""
from .engine import StepEngine

__all__ = ["StepEngine"]
