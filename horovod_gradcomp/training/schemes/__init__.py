"""Model averaging, EASGD, Downpour and ADAG on MPI (docs/schemes.md).

Every scheme has one shape: ``trainer.step()`` after ``backward()``, ``trainer.finish()``
at the end (every rank then holds the same model), ``stats()``, ``state_dict()``.
"""
from .averaging import ModelAveraging
from .easgd import EASGD
from .downpour import Downpour
from .adag import ADAG
from .base import Scheme

__all__ = ["ADAG", "Downpour", "EASGD", "ModelAveraging", "Scheme"]
