"""Errors raised on both sides of the transport seam.

:class:`ExchangeMismatchError` is raised by the exchange (the preamble finds that ranks disagree)
and by the transports (a collective received sizes that do not match what this rank expected),
so it lives below both; ``horovod_gradcomp`` re-exports it.
"""


class ExchangeMismatchError(RuntimeError):
    """Ranks disagree on what is exchanged (different parameter sets, shapes or codecs)."""


__all__ = ["ExchangeMismatchError"]
