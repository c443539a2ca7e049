"""Schemes pieces that need no mpirun: the payload wire format, ranges of the flat vector,
shard bounds, and (in a singleton MPI subprocess) the thread-level check and a clean exit
of a scheme that was never finished."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.training.schemes.sharded_center import shard_bounds
from horovod_gradcomp.training.schemes.coding import RangeCoder, pieces_of_range
from horovod_gradcomp.training.schemes.wire import pack_payload, unpack_payload

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", ["onebit", "terngrad", "qsgd", "dgc"])
def test_payload_round_trips_through_bytes(name):
    codec = hgc.get_codec(name, impl="reference")
    t = torch.randn(37, 5)
    payload = codec.encode(t.clone())
    back = unpack_payload(pack_payload(payload), t.shape, t.dtype)
    assert list(back.buffers) == list(payload.buffers)
    for k in payload.buffers:
        assert torch.equal(back.buffers[k].reshape(-1), payload.buffers[k].reshape(-1).cpu()), k
    assert torch.equal(codec.decode(back), codec.decode(payload))


def test_unpack_rejects_truncated_messages():
    payload = hgc.get_codec("onebit", impl="reference").encode(torch.randn(64))
    data = pack_payload(payload)
    with pytest.raises(ValueError):
        unpack_payload(data[:len(data) - 9], torch.Size([64]), torch.float32)


def test_pieces_cover_a_range_exactly():
    names, shapes = ["a", "b", "c"], [torch.Size([2, 3]), torch.Size([4]), torch.Size([5, 2])]
    for lo, hi in [(0, 20), (3, 12), (6, 10), (7, 8), (0, 0)]:
        pieces = pieces_of_range(names, shapes, lo, hi)
        covered = [i for _, start, shape in pieces for i in range(start, start + shape.numel())]
        assert covered == list(range(lo, hi))
    assert pieces_of_range(names, shapes, 6, 10)[0][2] == torch.Size([4])  # b whole: keeps its shape
    assert pieces_of_range(names, shapes, 7, 8)[0][2] == torch.Size([1])


def test_range_coder_raw_and_encoded_agree_with_decode():
    names, shapes = ["w", "b"], [torch.Size([60, 40]), torch.Size([60])]
    lo, hi = 5, 2427
    values = torch.randn(2460, dtype=torch.float64)
    raw = RangeCoder(pieces_of_range(names, shapes, lo, hi), lo, hi, torch.float64)
    msg, sent = raw.encode(values[lo:hi])
    assert torch.equal(raw.decode(msg), values[lo:hi]) and torch.equal(sent, values[lo:hi])
    from horovod_gradcomp.state.error_feedback import ErrorFeedback
    coded = RangeCoder(pieces_of_range(names, shapes, lo, hi), lo, hi, torch.float64,
                       hgc.get_codec("onebit", impl="reference"), ErrorFeedback())
    msg, sent = coded.encode(values[lo:hi])
    assert torch.equal(coded.decode(msg), sent)
    assert msg.size < (hi - lo) * 8 / 20  # 1 bit per value plus scales and headers


@pytest.mark.parametrize("numel,size", [(10, 3), (2, 4), (1000, 4), (7, 1)])
def test_shard_bounds_split_evenly(numel, size):
    b = shard_bounds(numel, size)
    sizes = [b[i + 1] - b[i] for i in range(size)]
    assert b[0] == 0 and b[-1] == numel and max(sizes) - min(sizes) <= 1


def _singleton(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.timeout(150)
def test_async_scheme_refuses_a_low_thread_level():
    proc = _singleton(
        "import mpi4py; mpi4py.rc.thread_level = 'serialized'\n"
        "from mpi4py import MPI\nimport torch, horovod_gradcomp as hgc\n"
        "m = torch.nn.Linear(3, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "try:\n    hgc.ADAG(m, o, window=2)\nexcept RuntimeError as e:\n    print('REFUSED', e)\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "REFUSED" in proc.stdout and "MPI_THREAD_MULTIPLE" in proc.stdout and "SERIALIZED" in proc.stdout


@pytest.mark.timeout(150)
def test_unfinished_async_scheme_exits_cleanly():
    proc = _singleton(
        "from mpi4py import MPI\nimport torch, horovod_gradcomp as hgc\n"
        "m = torch.nn.Linear(3, 2); o = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "t = hgc.Downpour(m, o, push_every=1, fetch_every=2)\n"
        "for _ in range(3):\n    o.zero_grad(); m(torch.randn(4, 3)).sum().backward(); t.step()\n"
        "print('PUSHES', t.stats()['pushes'])\n")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PUSHES 3" in proc.stdout
