"""Exchange patterns as sequences of collective requests, and what a driver of them must do.

Each pattern (:mod:`.allgather`, :mod:`.two_phase`, :mod:`.dense`, :mod:`.hierarchical`, the
preamble of :mod:`.preamble`) is written once, as a generator that *yields* the collectives it
needs and is *resumed* with their results; the encode and decode work sits between the yields.
It never calls a communicator itself. Whoever runs the generator, a *driver*, decides how each
request reaches the wire: :class:`~horovod_gradcomp.exchange.blocking_driver.BlockingDriver`
(Horovod, MPI: on the calling thread) or :mod:`horovod_gradcomp.ddp.future_driver` (the DDP
hook: on the communicator's asynchronous twins).

Why generators (the sans-I/O style of h11 and hyper-h2) rather than a communicator interface with
callbacks: the order of the collectives, which every rank must share, is then visible as the
order of the ``yield`` s in one function, and a driver needs no knowledge of any pattern. Why
:class:`Issue`/:class:`Wait` besides the plain :class:`Collective`: a pipelined bucket keeps
chunk i on the wire while it encodes chunk i+1, so it must be able to start a collective and
take its result later; a driver that cannot overlap may still answer :class:`Issue` by doing
the collective at once (the handle is then already done).

The driver interface, all of it (a third driver, e.g. FSDP2's reduce-scatter hook, implements
these three answers and nothing else):

* ``Collective(op, args, comm, kind, phase, last)``: do ``comm.<op>(*args)`` and resume the
  generator with its result. ``op`` is one of :data:`OPS`; ``kind`` names what it carries
  (timelines); ``phase``: the phase its wait is timed under ("": the plain exchange); ``last``:
  the bucket's final request (a driver that runs several buckets may let the next one issue
  once this one is out).
* ``Issue(collective)``: start the collective and resume at once with a *handle*: an object
  whose ``done()`` says whether its result is in (a hint: False is always allowed).
* ``Wait(handle)``: resume with the issued collective's result.

The generator's return value (``StopIteration.value``) is its result (a pattern's
:class:`~horovod_gradcomp.exchange.bucket.BucketOutcome`). A failed collective ends the sequence:
the driver raises its error and resumes the generator no more. Whenever a sequence ends with an
error (a collective's or the generator's own), the driver still waits out every collective it
issued that nobody waited for (a collective cannot be left halfway: its peers may be inside it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator

from ..transports.interface import COLLECTIVES

#: The collectives a pattern may request: those of the transport interface
#: (:class:`~horovod_gradcomp.transports.interface.Communicator`), and ``sizes`` (every rank's
#: int; the asynchronous communicators only, :class:`~horovod_gradcomp.transports.interface.AsyncCommunicator`).
OPS = COLLECTIVES + ("sizes",)


@dataclass
class Collective:
    """One collective: ``comm.<op>(*args)``, resumed with its result (the fields: see the module
    doc; ``kind`` defaults to ``op``)."""
    op: str
    args: tuple
    comm: Any
    kind: str = ""
    phase: str = ""
    last: bool = False

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"unknown collective {self.op!r}; one of {OPS}")
        self.kind = self.kind or self.op


@dataclass
class Issue:
    """Start ``collective``; resumed with a handle (``done()``), whose result :class:`Wait` takes."""
    collective: Collective


@dataclass
class Wait:
    """The result of an issued collective (``handle``: what :class:`Issue` was answered with)."""
    handle: Any


Request = Any  # Collective | Issue | Wait
#: A pattern's sequence: yields requests, is sent their answers, returns its outcome.
Steps = Generator[Request, Any, Any]


def passed_on(steps: Steps) -> Steps:
    """``steps`` with every request's ``last`` cleared: for a sequence nested inside another that
    still has requests to make after it (the hierarchical pattern's inner exchange)."""
    try:
        request = next(steps)
        while True:
            target = request.collective if isinstance(request, Issue) else request
            if isinstance(target, Collective):
                target.last = False
            request = steps.send((yield request))
    except StopIteration as stop:
        return stop.value


__all__ = ["Collective", "Issue", "OPS", "Request", "Steps", "Wait", "passed_on"]
