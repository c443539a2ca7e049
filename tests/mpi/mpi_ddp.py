"""The DDP comm hook against the mpi4py path under mpirun (-np 1, 2, 3, 4).

torch.distributed (gloo) is initialized on the mpirun ranks. A DDP model with
``hgc.ddp.register`` trains a few steps; every step its averaged gradients must be bitwise
what the Horovod path's engine over mpi4py makes of the same local gradients (computed on a
plain copy of the model) with the same bucket partition (DDP's buckets, which the hook reports
in ``state.last_partition``), for every codec and both patterns; the hook's state_dict must
equal the mpi4py compression's. Then: the per-bucket hook overlaps backward (the backward halts
halfway until a bucket's payload has completed, and a timeline shows it starting before DDP hands
over its last bucket; not so with one exchange per step), and each failure reaches ``backward()``
as the DDPExchangeError with its own message, on every rank.
"""
from __future__ import annotations

import copy
import os
import socket
import time
import warnings

import horovod.torch as hvd
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange import preamble
from horovod_gradcomp.exchange.timeline import Timeline

from .mpi_helpers import init
from .mpi_transports import flat_state

RANK, SIZE = init()
STEPS = 3

CASES = {  # id: (codec, options)
    "onebit": ("onebit", {}),
    "onebit-two_phase": ("onebit", {"pattern": "two_phase"}),
    "onebit-one_exchange": ("onebit", {"per_bucket": False}),
    "onebit-find_unused": ("onebit", {"find_unused_parameters": True}),
    "onebit-warmup": ("onebit", {"warmup_steps": 2}),   # two dense steps, then onebit
    "onebit-lr_warmup": ("onebit", {"lr_warmup_steps": 3, "scales": "rows"}),   # opt-in: results scaled by 1/3, 2/3, 1
    "terngrad": ("terngrad", {"seed": 1}),
    "terngrad-two_phase": ("terngrad", {"seed": 1, "pattern": "two_phase"}),
    "qsgd-two_phase": ("qsgd", {"bits": 4, "bucket": 32, "seed": 2, "pattern": "two_phase"}),
    "qsgd-elias": ("qsgd", {"bits": 4, "coding": "elias", "seed": 3}),
    "dgc": ("dgc", {"density": 0.1, "seed": 4, "momentum": 0.9}),
    "dgc-clip": ("dgc", {"density": 0.1, "seed": 5, "momentum": 0.9, "clip_norm": 0.5}),   # one exchange per step
}


def setup_module(module):
    if not dist.is_initialized():
        port = None
        if RANK == 0:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
        port = hvd.broadcast_object(port, root_rank=0, name="hgc.test.ddp.port")
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=RANK, world_size=SIZE)


def model():
    torch.manual_seed(0)
    # small buckets: the model spans several DDP buckets
    return nn.Sequential(nn.Linear(12, 40), nn.ReLU(), nn.Linear(40, 30), nn.ReLU(), nn.Linear(30, 5))


def batch(step, rank):
    gen = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 12, generator=gen), torch.randint(0, 5, (16,), generator=gen)


def step_against_mpi_path(ddp, plain, state, by_mpi, step, case):
    """One training step of ``ddp`` (through the hook of ``state``) and of its copy ``plain``
    (through ``by_mpi``'s engine, on DDP's bucket partition of the step): asserts the averaged
    gradients are bitwise equal, then applies the same SGD update to both copies (so their
    inputs stay equal). Returns the partition and the mpi4py path's results."""
    x, y = batch(step, RANK)
    ddp.zero_grad()
    F.cross_entropy(ddp(x), y).backward()
    plain.zero_grad()
    F.cross_entropy(plain(x), y).backward()
    partition = state.last_partition
    want = by_mpi.engine.exchange({n: p.grad.clone() for n, p in plain.named_parameters()}, partition=partition)
    by_mpi.index.end_step()
    for n, p in ddp.module.named_parameters():
        assert torch.equal(p.grad, want[n]), f"{case} step {step}: {n} differs from the mpi4py path"
    with torch.no_grad():
        for (n, p), q in zip(plain.named_parameters(), ddp.module.parameters()):
            p -= 0.1 * want[n]
            q -= 0.1 * q.grad
    return partition, want


@pytest.mark.parametrize("case", list(CASES))
def test_ddp_hook_matches_mpi_path_bitwise(case):
    codec, options = CASES[case]
    options = dict(options)
    per_bucket = options.pop("per_bucket", True)
    unused = options.pop("find_unused_parameters", False)
    plain = model()
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.004, find_unused_parameters=unused)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        state = hgc.ddp.register(ddp, codec, per_bucket=per_bucket, **options)
    # DDP's own group, unless DDP issues collectives of its own during backward (find_unused_parameters)
    assert (state.communicator.group is ddp.process_group) == (not unused)
    clipping = "clip_norm" in options
    assert state.per_bucket == (per_bucket and not clipping)
    if clipping:   # said once per process: the first clipping DGC of the suite
        assert any("one exchange per step" in str(w.message) for w in caught)
    factory = getattr(hgc.Compression, codec)
    extra = {"check_optimizer": False} if codec == "dgc" else {}
    by_mpi = factory(list(plain.named_parameters()), transport="mpi", **options, **extra)
    for step in range(STEPS):
        partition, _ = step_against_mpi_path(ddp, plain, state, by_mpi, step, case)
        assert sorted(n for b in partition for n in b) == sorted(n for n, _ in plain.named_parameters())
        assert len(partition) > 1 or not state.per_bucket or step == 0, f"{case}: the model should span several buckets"
    a, b = flat_state(state.state_dict()), flat_state(by_mpi.state_dict())
    assert [k for k, _ in a] == [k for k, _ in b]
    assert all(torch.equal(x, y) for (_, x), (_, y) in zip(a, b))
    stats, want_stats = state.stats(), by_mpi.stats()
    assert stats["steps"] == STEPS
    for key in ("bytes_payload", "bytes_sent", "tensors"):
        assert stats[key] == want_stats[key], key


NONFINITE_CASES = ["onebit", "onebit-two_phase", "terngrad-two_phase", "qsgd-two_phase", "qsgd-elias", "dgc",
                   "dgc-clip"]


@pytest.mark.parametrize("bad", ["nan", "inf"])
@pytest.mark.parametrize("case", NONFINITE_CASES)
def test_nonfinite_gradient_on_one_rank_skips_the_step_everywhere(case, bad, monkeypatch):
    """A NaN or Inf input on the last rank at step 1: every result is NaN on every rank, the
    memory (residuals, owner residuals, velocities) is bitwise as before the step. Only DGC
    without clipping reads the gradients for the check (has_nonfinite, patched to raise for the
    others: onebit, TernGrad and QSGD take it from their encode, DGC with clipping from its norm)."""
    codec, options = CASES[case]
    if case != "dgc":
        def refuse(grads):
            raise AssertionError(f"{case}: has_nonfinite called")
        monkeypatch.setattr(preamble, "has_nonfinite", refuse)
    plain = model()
    ddp = nn.parallel.DistributedDataParallel(copy.deepcopy(plain), bucket_cap_mb=0.004)
    state = hgc.ddp.register(ddp, codec, **options)
    for step in range(3):
        x, y = batch(step, RANK)
        if step == 1 and RANK == SIZE - 1:
            x[0, 0] = float(bad)
        before = flat_state(state.state_dict())
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        grads = [p.grad for p in ddp.module.parameters()]
        if step == 1:
            assert all(bool(g.isnan().all()) for g in grads), "every result of a skipped step is NaN, on every rank"
            after = flat_state(state.state_dict())
            assert [k for k, _ in before] == [k for k, _ in after], "the skipped step created state"
            assert all(torch.equal(u, v) for (_, u), (_, v) in zip(before, after)), "memory rolled back"
            assert state.stats()["nonfinite_steps"] == 1
        else:
            assert all(bool(g.isfinite().all()) for g in grads)


PAYLOAD_KINDS = ("payload", "alltoallv")   # the payloads' collectives (allgather; two-phase, onebit's default from K = 3)
GATE_LIMIT_S = 120.0


def _is_payload(iv) -> bool:
    return iv.phase == "collective" and iv.thread.split(": ")[-1] in PAYLOAD_KINDS


class _Gate(torch.autograd.Function):
    """Identity. Its backward, which runs when the layers above it have their gradients (their
    buckets handed over) and those below it not yet, waits until ``opened()`` holds, for at most
    GATE_LIMIT_S; ``waits`` records whether it opened."""

    @staticmethod
    def forward(ctx, x, opened, waits):
        ctx.opened, ctx.waits = opened, waits
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        deadline = time.monotonic() + GATE_LIMIT_S
        while not ctx.opened() and time.monotonic() < deadline:
            time.sleep(0.002)
        ctx.waits.append(ctx.opened())
        return grad, None, None


class GatedDeepModel(nn.Module):
    """Ten 512x512 layers and a head; once ``opened`` is set, a :class:`_Gate` after the fifth."""

    def __init__(self, opened=None):
        super().__init__()
        torch.manual_seed(1)
        self.lower = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(512, 512), nn.ReLU())])
        self.upper = nn.Sequential(*[m for _ in range(5) for m in (nn.Linear(512, 512), nn.ReLU())],
                                   nn.Linear(512, 10))
        self.opened, self.waits = opened, []

    def forward(self, x):
        h = self.lower(x)
        return self.upper(_Gate.apply(h, self.opened, self.waits) if self.opened is not None else h)


def _timed_backward(per_bucket: bool):
    """Three steps, one layer a bucket; the timelines of the last two (DDP rebuilds its buckets
    after the first) as [(ready, collectives, backward), ...], and whether the gate opened in
    each of those two. Per bucket, the backward halts at the gate between the upper and the
    lower five layers until a payload collective of this step has completed: the overlap is
    then a matter of order, not of the machine's timing (if the hook sent nothing before
    backward ended, the gate would stay closed)."""
    timeline = Timeline()
    net = GatedDeepModel()
    ddp = nn.parallel.DistributedDataParallel(net, bucket_cap_mb=1.1)   # about one layer a bucket
    state = hgc.ddp.register(ddp, "onebit", per_bucket=per_bucket)
    state.timeline = timeline
    x, y = torch.randn(256, 512), torch.randint(0, 10, (256,))
    steps = []
    for step in range(3):
        if step == 1 and per_bucket:   # DDP's first step hands over one bucket
            net.opened = lambda: any(_is_payload(iv) for iv in list(timeline.intervals))
        ddp.zero_grad()
        with timeline.span("backward"):
            F.cross_entropy(ddp(x), y).backward()
        intervals = timeline.take()
        if step == 0:
            continue
        ready = sorted(iv.t0 for iv in intervals if iv.phase == "bucket_ready")
        collectives = [iv for iv in intervals if iv.phase == "collective"]
        backward = next(iv for iv in intervals if iv.phase == "backward")
        assert len(ready) == len(state.last_partition if per_bucket else ready) and len(ready) >= 5
        steps.append((ready, collectives, backward))
    return steps, net.waits


def _on_every_rank(problem: str) -> None:
    """Fail on every rank if any rank found a problem (a timing check that fails on one rank
    alone would leave the others waiting in the next test's collectives)."""
    flag = torch.tensor([1 if problem else 0])
    dist.all_reduce(flag)
    hgc.ddp.keep_until_exit(flag)   # the suite's last collective may be this one
    assert not problem, problem
    assert int(flag) == 0, "the check failed on another rank"


def _overlap_problem(ready, collectives, backward) -> str:
    data = sorted(iv.t0 for iv in collectives if _is_payload(iv))
    if len(data) != len(ready):
        return f"{len(data)} payload collectives for {len(ready)} buckets"
    if not all(backward.t0 <= iv.t0 and iv.t1 <= backward.t1 for iv in collectives):
        return "a collective outside its step's backward"
    if not data[0] < ready[-1]:   # the first bucket's payload is on the wire before the last bucket is handed over
        return f"no overlap: first payload at {data[0]:.3f}, last bucket at {ready[-1]:.3f}"
    return ""


def test_per_bucket_collectives_overlap_backward():
    """In every step, on every rank."""
    steps, waits = _timed_backward(per_bucket=True)
    problems = [p for p in (_overlap_problem(*step) for step in steps) if p]
    if waits != [True] * 2:
        problems.append(f"the gate opened (a payload completed during backward) in these steps: {waits}")
    _on_every_rank("; ".join(problems))
    steps, _ = _timed_backward(per_bucket=False)
    problems = [f"one exchange per step started at {min(iv.t0 for iv in c):.3f}, before the last bucket {r[-1]:.3f}"
                for r, c, _ in steps if min(iv.t0 for iv in c) < r[-1]]
    _on_every_rank("; ".join(problems))


def test_error_in_one_bucket_reaches_backward_as_its_own_exception():
    """An encode that fails in bucket 1 at step 2: ``backward()`` raises the DDPExchangeError
    itself (its class and message, never DDP's "Unable to cast ... to Tensor"), on every rank;
    every future of the step completed (with its buffer: DDP's state stays consistent); the
    memory is rolled back; and the next step trains normally."""
    torch.manual_seed(2)
    layers = [nn.Linear(12, 20)] + [nn.Linear(20, 20) for _ in range(3)] + [nn.Linear(20, 5)]
    ddp = nn.parallel.DistributedDataParallel(nn.Sequential(*layers), bucket_cap_mb=0.0015)   # a layer a bucket
    state = hgc.ddp.register(ddp, "onebit")
    futures = []
    hand_over = state.on_bucket

    def recording(bucket):
        fut = hand_over(bucket)
        futures.append(fut)
        return fut
    state.on_bucket = recording
    for step in range(2):   # DDP's buckets are fixed from the second step on
        x, y = batch(step, RANK)
        ddp.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
    partition = state.last_partition
    assert len(partition) >= 3
    poisoned = partition[1][0]
    memory = state.compression.state.memory
    encode = memory.encode_many

    def failing(codec, names, *args, **kwargs):
        if poisoned in names:
            raise ValueError(f"injected failure encoding {poisoned}")
        return encode(codec, names, *args, **kwargs)
    memory.encode_many = failing
    before = flat_state(state.state_dict())
    futures.clear()
    x, y = batch(2, RANK)
    ddp.zero_grad()
    with pytest.raises(hgc.ddp.DDPExchangeError) as info:
        F.cross_entropy(ddp(x), y).backward()
    assert str(info.value) == (f"hgc.ddp: step 2, bucket 1 failed on rank {RANK}: ValueError: injected failure "
                               f"encoding {poisoned}"), str(info.value)
    assert isinstance(info.value.__cause__, ValueError)
    assert len(futures) == len(partition) and all(f.done() for f in futures)
    after = flat_state(state.state_dict())
    assert all(torch.equal(u, v) for (_, u), (_, v) in zip(before, after)), "the failed step's memory rolled back"
    memory.encode_many = encode
    ddp.zero_grad()
    F.cross_entropy(ddp(x), y).backward()   # the next step runs: DDP and the hook are in a consistent state
    assert state.stats()["steps"] == 3 and all(torch.isfinite(p.grad).all() for p in ddp.parameters())


def test_a_parameter_the_hook_does_not_know_fails_with_its_message():
    """A parameter that DDP reduces but that was frozen when the hook was registered."""
    torch.manual_seed(3)
    ddp = nn.parallel.DistributedDataParallel(model())
    frozen = ddp.module[2].weight
    frozen.requires_grad_(False)
    hgc.ddp.register(ddp, "qsgd")
    frozen.requires_grad_(True)
    x, y = batch(0, RANK)
    with pytest.raises(hgc.ddp.DDPExchangeError, match=rf"^hgc.ddp: step 0, bucket \d+ failed on rank {RANK}: "
                                                       "KeyError: 'a bucket holds a parameter that is not in the "
                                                       r"module given to hgc.ddp.register\(\)'$"):
        F.cross_entropy(ddp(x), y).backward()


@pytest.mark.skipif(SIZE < 2, reason="needs two ranks to disagree")
def test_ranks_that_disagree_fail_with_the_mismatch_message_on_every_rank():
    torch.manual_seed(4)
    ddp = nn.parallel.DistributedDataParallel(model())
    hgc.ddp.register(ddp, "qsgd", bits=4 if RANK == 0 else 2)
    x, y = batch(0, RANK)
    with pytest.raises(hgc.ddp.DDPExchangeError) as info:
        F.cross_entropy(ddp(x), y).backward()
    text = str(info.value)
    assert text.startswith(f"hgc.ddp: step 0, bucket 0 failed on rank {RANK}: ExchangeMismatchError: "), text
    assert "disagree" in text and "Unable to cast" not in text, text


def test_hook_outside_backward_fails_its_futures():
    """DDP's Join calls the hook outside a backward pass: there the futures raise the error."""
    ddp = nn.parallel.DistributedDataParallel(model())
    state = hgc.ddp.register(ddp, "onebit")

    class Bucket:
        def buffer(self):
            return torch.zeros(3)

        def is_last(self):
            return True

        def index(self):
            return 0

        def parameters(self):
            return [torch.nn.Parameter(torch.zeros(3))]   # not the model's

        def gradients(self):
            return [torch.zeros(3)]
    fut = state.on_bucket(Bucket())
    with pytest.raises(RuntimeError, match=f"hgc.ddp: step 0, bucket 0 failed on rank {RANK}: KeyError: 'a bucket "
                                           "holds a parameter"):
        fut.wait()


def test_register_rejects_bad_input():
    ddp = nn.parallel.DistributedDataParallel(model())
    with pytest.raises(ValueError, match="unknown codec"):
        hgc.ddp.register(ddp, "nope")
    with pytest.raises(ValueError, match="does not apply"):
        hgc.ddp.register(ddp, "onebit", bucket_bytes=1 << 20)
    with pytest.raises(TypeError, match="DistributedDataParallel"):
        hgc.ddp.register(model(), "onebit")
