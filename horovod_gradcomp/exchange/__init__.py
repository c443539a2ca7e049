"""Where payloads travel: communicators, fusion, buckets and plans, the allgather and two-phase
patterns, stripes, the step engine and statistics."""
from .communicator import ExchangeMismatchError, MPICommunicator, default_communicator
from .engine import StepEngine
from .polling import PollingCommunicator

__all__ = ["ExchangeMismatchError", "MPICommunicator", "PollingCommunicator", "StepEngine", "default_communicator"]
