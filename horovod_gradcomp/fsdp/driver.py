"""Run a pattern job to its end with blocking collectives.

A job (:mod:`horovod_gradcomp.exchange.reduce_scatter`) yields
:class:`~horovod_gradcomp.ddp.bucket_exchange.Call` s; this driver issues each one, waits for its
result on the calling thread and resumes the job with it, in order. FSDP2 calls its reduce-scatter
on the backward thread and reads the output right after, so nothing is gained by overlapping here;
any driver that answers the same calls in the same order can replace this one.
"""
from __future__ import annotations

from typing import Generator, TypeVar

T = TypeVar("T")


def run_blocking(job: Generator[object, object, T]) -> T:
    """Drive ``job`` until it returns; return its value (exceptions propagate from the job or
    from a failed collective)."""
    try:
        call = next(job)
        while True:
            call = job.send(call.fn(*call.args).wait())
    except StopIteration as stop:
        return stop.value
