"""plan_chunks (exchange/pipeline.py): how a bucket is cut into pipelined chunks, and the wire
thread's ordering. The bitwise equality of pipelined and whole exchanges is checked under MPI
(tests/mpi/mpi_buckets.py::test_pipelined_chunks_change_nothing)."""
from __future__ import annotations

import threading

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.pipeline import MAX_CHUNKS, WireThread, plan_chunks

pytestmark = pytest.mark.timeout(60)


def _entries(sizes):
    return [(f"t{i}", torch.Size([n]), torch.float32) for i, n in enumerate(sizes)]


@pytest.mark.parametrize("codec_name", ["onebit", "terngrad", "qsgd"])
@pytest.mark.parametrize("sizes", [[1], [7, 1, 8193], [1000] * 40, [50_000, 3, 3, 70_000, 1, 1, 120_000]])
@pytest.mark.parametrize("chunk_bytes", [1, 300, 10_000, 1 << 30])
def test_chunks_cover_the_bucket_in_order(codec_name, sizes, chunk_bytes):
    codec = hgc.get_codec(codec_name)
    entries = _entries(sizes)
    chunks = plan_chunks(codec, entries, chunk_bytes)
    assert [e for chunk in chunks for e in chunk] == entries          # consecutive, every tensor once
    assert 1 <= len(chunks) <= MAX_CHUNKS and all(chunks)
    nbytes = [sum(codec.payload_nbytes(s, d) for _, s, d in chunk) for chunk in chunks]
    floor = max(chunk_bytes, -(-sum(nbytes) // MAX_CHUNKS))
    assert all(b >= floor for b in nbytes[:-1])                        # only the last may be smaller
    if len(chunks) > 1:
        assert nbytes[-1] >= floor // 2                                # a small tail joins its neighbour


def test_chunk_plan_rejects_nonsense():
    with pytest.raises(ValueError, match="positive"):
        plan_chunks(hgc.get_codec("onebit"), _entries([4]), 0)


def test_wire_thread_runs_calls_in_submission_order_on_one_thread():
    wire, seen = WireThread(), []
    futures = [wire.submit(lambda i: seen.append((i, threading.current_thread().name)) or i, i) for i in range(50)]
    assert [f.result(timeout=10) for f in futures] == list(range(50))
    assert [i for i, _ in seen] == list(range(50)) and len({name for _, name in seen}) == 1
    failing = wire.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing.result(timeout=10)
    WireThread.cancel([failing, wire.submit(lambda: None)])            # waits, never raises


def test_wire_poll_interval_from_the_environment(monkeypatch):
    from horovod_gradcomp.exchange import pipeline
    from horovod_gradcomp.transports.mpi import MPICommunicator
    monkeypatch.delenv(pipeline.WIRE_POLL_ENV, raising=False)
    assert pipeline.wire_poll_s() == pipeline.WIRE_POLL_S
    monkeypatch.setenv(pipeline.WIRE_POLL_ENV, "0")
    plain = MPICommunicator(comm=object())
    assert pipeline.wire_communicator(plain) is plain                  # 0: blocking collectives
    monkeypatch.setenv(pipeline.WIRE_POLL_ENV, "1e-3")
    polled = pipeline.wire_communicator(plain)
    assert polled is not plain and polled.comm._interval == 1e-3
    other = object()                                                   # no polling(): used as is
    assert pipeline.wire_communicator(other) is other
    for bad in ("-1", "soon", "inf", "nan"):
        monkeypatch.setenv(pipeline.WIRE_POLL_ENV, bad)
        with pytest.raises(ValueError, match=pipeline.WIRE_POLL_ENV):
            pipeline.wire_poll_s()
