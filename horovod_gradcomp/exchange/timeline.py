"""A per-step timeline of where the time goes, recorded only when asked for.

A :class:`Timeline` is a list of intervals ``(phase, thread, t0, t1)`` (``time.perf_counter``
seconds). Nothing records into one unless it is attached: ``ExchangeStats.timeline`` (every
``timed`` block of the engine and the patterns: ``encode``, ``exchange`` (packing and
collectives), ``decode``, ``preamble``), :class:`TimedCommunicator` (each collective, as
``collective``), and whatever a benchmark wraps with :meth:`Timeline.span` (the step, backward,
Horovod's hooks, ``synchronize``, the optimizer). With no timeline attached the cost is one
attribute test per timed block.

:func:`exclusive_times` turns the intervals of one step into the time spent in each phase and
nowhere below it (a parent's time minus its children's), per thread; a collective is named
after the phase it runs in (``preamble/collective``: waiting for the other ranks and the
preamble's bytes; ``exchange/collective``: the data on the wire), so the main thread's phases
add up to its step.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Dict, List, NamedTuple, Sequence

from ..transports.interface import COLLECTIVES, PollableCommunicator


class Interval(NamedTuple):
    phase: str
    thread: str
    t0: float
    t1: float


class Timeline:
    """Intervals recorded from any thread (``list.append`` is atomic under the GIL)."""

    def __init__(self):
        self.intervals: List[Interval] = []

    def add(self, phase: str, t0: float, t1: float) -> None:
        """Record ``phase`` from ``t0`` to ``t1`` on the calling thread."""
        self.intervals.append(Interval(phase, threading.current_thread().name, t0, t1))

    @contextmanager
    def span(self, phase: str):
        """Record the ``with`` block as ``phase``."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.add(phase, t0, time.perf_counter())

    def wrap(self, phase: str, fn):
        """``fn`` with every call recorded as ``phase``."""
        def timed_call(*args, **kwargs):
            with self.span(phase):
                return fn(*args, **kwargs)
        return timed_call

    def take(self) -> List[Interval]:
        """The intervals recorded so far; the timeline starts empty again."""
        out, self.intervals = self.intervals, []
        return out


class TimedCommunicator:
    """A communicator whose collectives are recorded as ``collective`` on ``timeline``; every
    other attribute is the wrapped communicator's."""

    def __init__(self, comm, timeline: Timeline):
        self._comm, self._timeline = comm, timeline

    def __getattr__(self, name):
        attr = getattr(self._comm, name)
        if name in COLLECTIVES:
            return self._timeline.wrap("collective", attr)
        return attr

    @property
    def recorded_communicator(self):
        """The wrapped communicator (what topology splits into node communicators)."""
        return self._comm

    def record(self, comm) -> "TimedCommunicator":
        """``comm`` (a sub-communicator of the wrapped one) recorded on the same timeline."""
        return TimedCommunicator(comm, self._timeline)

    def polling(self, interval_s: float):
        """The wrapped communicator's polling view, recorded the same way."""
        if not isinstance(self._comm, PollableCommunicator):
            return self
        return TimedCommunicator(self._comm.polling(interval_s), self._timeline)


def attach(engine, timeline: Timeline) -> None:
    """Record ``engine``'s timed blocks and collectives (a :class:`~horovod_gradcomp.exchange.engine.StepEngine`)
    on ``timeline`` from now on; the engine's results are unchanged."""
    engine.stats.timeline = timeline
    resolve = engine.communicator
    engine.communicator = lambda: TimedCommunicator(resolve(), timeline)
    engine.finish = timeline.wrap("flush", engine.finish)


def exclusive_times(intervals: Sequence[Interval]) -> Dict[str, Dict[str, float]]:
    """thread -> phase -> seconds spent in that phase outside its nested phases, from the
    intervals of one step. Nesting is by containment on the same thread; a ``collective``
    is keyed ``<parent phase>/collective``. On a thread whose outermost interval is the step,
    the values add up to the step's duration."""
    out: Dict[str, Dict[str, float]] = {}
    by_thread: Dict[str, List[Interval]] = {}
    for iv in intervals:
        by_thread.setdefault(iv.thread, []).append(iv)
    for thread, ivs in by_thread.items():
        ivs = sorted(ivs, key=lambda iv: (iv.t0, -iv.t1))
        totals: Dict[str, float] = {}
        stack: List[tuple] = []           # (interval, key)
        for iv in ivs:
            while stack and stack[-1][0].t1 <= iv.t0:
                stack.pop()
            parent = stack[-1] if stack and iv.t1 <= stack[-1][0].t1 else None
            key = iv.phase
            if iv.phase == "collective":
                key = f"{parent[1].split('/')[0] if parent else 'none'}/collective"
            duration = iv.t1 - iv.t0
            totals[key] = totals.get(key, 0.0) + duration
            if parent is not None:
                totals[parent[1]] -= duration
            stack.append((iv, key))
        out[thread] = totals
    return out


def split_steps(intervals: Sequence[Interval], step_phase: str = "step") -> List[List[Interval]]:
    """The intervals of each ``step_phase`` interval (any thread), in time order: an interval
    belongs to the step during which it started."""
    steps = sorted((iv for iv in intervals if iv.phase == step_phase), key=lambda iv: iv.t0)
    groups: List[List[Interval]] = [[] for _ in steps]
    for iv in intervals:
        for j, s in enumerate(steps):
            if s.t0 <= iv.t0 <= s.t1:
                groups[j].append(iv)
                break
    return groups


__all__ = ["Interval", "Timeline", "TimedCommunicator", "attach", "exclusive_times", "split_steps"]
