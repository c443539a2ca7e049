"""exchange/stream_handoff.py: gradients and results cross threads through recorded marks.

On CPU tensors a mark carries no event and a wait does nothing, but both are counted and logged
with the thread that made them: these tests check, through the real engine (its ``hgc-exchange``
worker), the pipeline's wire thread and the DDP hook's threads, that every hand-over is recorded
by the producer's thread and waited by the consumer's. The CUDA branch (which events are waited
for) runs here with the three torch.cuda calls replaced; the calls themselves need a GPU
(ci/gpu_exchange_check.py)."""
from __future__ import annotations

import threading

import pytest
import torch
import torch.distributed as dist

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange import stream_handoff
from horovod_gradcomp.exchange.pipeline import WireThread
from horovod_gradcomp.exchange.stream_handoff import StreamHandoff, tensors_in
from one_rank import OneRank

MAIN = threading.main_thread().name


def test_cpu_marks_carry_no_event_and_are_counted():
    h = StreamHandoff()
    t = torch.ones(3)
    mark = h.record("grad", (t,))
    assert mark.what == "grad" and mark.events == () and mark.thread == MAIN
    h.wait(mark, (t,))
    h.wait(None)
    h.wait_all([None, mark, h.record("grad")])
    assert h.records == {"grad": 2} and h.waits == {"grad": 3}
    assert h.seen("record", "grad") == [MAIN, MAIN] and h.seen("wait", "grad") == [MAIN] * 3


def test_tensors_in():
    a, b = torch.zeros(1), torch.zeros(2)
    assert tensors_in(a) == [a]
    assert tensors_in((1, [a, (b, "x")], None)) == [a, b]
    assert tensors_in({"a": a}) == [] and tensors_in(3) == []


def test_cuda_branch_waits_for_the_last_event_of_each_stream(monkeypatch):
    """Which events a consumer waits for, with the torch.cuda calls replaced by recorders."""
    stream = {"id": 7}
    made, waited = [], []

    def record_event(device):
        made.append((device, f"e{len(made)}"))
        return stream["id"], made[-1][1]

    monkeypatch.setattr(stream_handoff, "_record_event", record_event)
    monkeypatch.setattr(stream_handoff, "_wait_event", lambda device, event: waited.append((device, event)))
    monkeypatch.setattr(stream_handoff, "_keep_for_stream", lambda t: pytest.fail("no CUDA tensor here"))
    h = StreamHandoff()
    cuda0 = torch.device("cuda", 0)
    first = h.record("grad", devices=["cuda:0", "cpu"])
    second = h.record("grad", devices=[cuda0])
    stream["id"] = 8                                   # a third mark from another stream
    third = h.record("grad", devices=[cuda0])
    assert [e[:2] for e in first.events] == [(cuda0, 7)] and second.events[0][2] == "e1"
    h.wait_all([third, second, first], tensors=[torch.zeros(2)])
    assert sorted(waited) == [(cuda0, "e1"), (cuda0, "e2")]   # e0 is covered by e1 on stream 7
    assert h.waits["grad"] == 3
    waited.clear()
    h.wait(first)
    assert waited == [(cuda0, "e0")]


def test_wire_thread_hands_its_calls_over_both_ways():
    wire = WireThread(name="hgc-wire-test")
    send = torch.arange(4)
    fut = wire.submit(lambda x: [x * 2, x + 1], send)
    out = fut.result(timeout=30)
    assert torch.equal(out[0], send * 2) and fut.done() and not fut.cancelled()
    h = wire.handoff
    assert h.seen("record", "wire-send") == [MAIN]
    assert [t.startswith("hgc-wire-test") for t in h.seen("wait", "wire-send")] == [True]
    assert [t.startswith("hgc-wire-test") for t in h.seen("record", "wire-recv")] == [True]
    assert h.seen("wait", "wire-recv") == [MAIN]

    def fails():
        raise RuntimeError("collective failed")

    bad = wire.submit(fails)
    assert isinstance(bad.exception(timeout=30), RuntimeError)
    with pytest.raises(RuntimeError, match="collective failed"):
        bad.result()
    WireThread.cancel([bad, fut])


def _named():
    return [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in (("a", (30, 20)), ("b", (50,)), ("c", (8, 3, 3)))]


def _grads(step):
    gen = torch.Generator().manual_seed(step)
    return {n: torch.randn(p.shape, generator=gen) for n, p in _named()}


def test_engine_hands_gradients_to_its_exchange_thread_and_results_back():
    """From the second step (a bucket plan exists) the buckets go on the ``hgc-exchange`` worker:
    every gradient is marked on the submitting thread and waited by the worker before it is read;
    every bucket's results are marked by the worker and waited by the thread that calls finish()."""
    comp = hgc.Compression.codec("onebit", _named(), communicator=OneRank(), bucket_bytes=2048, overlap=True)
    plain = hgc.Compression.codec("onebit", _named(), communicator=OneRank(), bucket_bytes=2048, overlap=False)
    engine, h = comp.engine, comp.engine.handoff
    for step in range(3):
        grads = _grads(step)
        for n, g in grads.items():
            engine.submit(n, g)
        out = engine.finish()
        want = plain.engine.exchange(_grads(step))
        for n in grads:
            assert torch.equal(out[n], want[n]), (step, n)
    assert h.records["grad"] == 9 and h.waits["grad"] == 9
    assert set(h.seen("record", "grad")) == {MAIN}
    assert h.seen("wait", "grad")[:3] == [MAIN] * 3                  # step 0: exchanged at the flush
    assert set(h.seen("wait", "grad")[3:]) == {"hgc-exchange"}       # then on the worker
    assert "hgc-exchange" in h.seen("record", "result")
    assert set(h.seen("wait", "result")) == {MAIN}
    assert h.records["result"] == h.waits["result"] >= 3


def test_engine_exchange_and_abort_leave_no_mark_behind():
    comp = hgc.Compression.codec("onebit", _named(), communicator=OneRank())
    engine = comp.engine
    comp.exchange(_grads(0))
    assert engine.handoff.records["grad"] == 1 and engine.handoff.waits["grad"] == 1   # one mark for the step
    engine.submit("a", _grads(1)["a"])
    engine.abort_step()
    assert engine._marks == {} and engine._result_marks == []


@pytest.fixture
def gloo_world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_hook_hands_buckets_over_between_its_threads(gloo_world_of_one):
    """DDP's thread marks each bucket; the sequencer waits for it before the bucket's first read;
    a job resumed by a waiter thread waits for the issuing thread's mark; results are marked where
    they are decoded and waited by the thread that completes DDP's futures."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = hgc.ddp.register(ddp, "onebit")
    h = state.handoff
    assert h is state.engine.handoff
    for step in range(2):
        ddp.zero_grad()
        ddp(torch.randn(8, 4, generator=torch.Generator().manual_seed(step))).square().sum().backward()
    buckets = len(state.last_partition)
    assert h.records["grad"] == h.waits["grad"] == 2 * buckets
    assert set(h.seen("record", "grad")) == {MAIN}
    assert set(h.seen("wait", "grad")) == {"hgc-ddp"}
    assert h.records["resume"] == h.waits["resume"] > 0
    assert set(h.seen("wait", "resume")) == {"hgc-ddp-wait"}
    assert h.records["result"] == h.waits["result"] == 2 * buckets
    assert set(h.seen("record", "result")) <= {"hgc-ddp", "hgc-ddp-wait"}
    assert set(h.seen("wait", "result")) <= {"hgc-ddp", "hgc-ddp-wait"}
    assert state.wait_idle(30)


@pytest.mark.requires_cuda
def test_real_events_order_a_side_stream_write_before_another_threads_read():
    """On a GPU: a tensor written on a side stream behind a sleep, handed to a thread whose
    stream reads it, and its result handed back, without any device synchronize."""
    h, side = StreamHandoff(), torch.cuda.Stream()
    src = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()   # setup only
    box = {}
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        grad = src * 2.0
        mark = h.record("grad", (grad,))

    def consumer():
        h.wait(mark, (grad,))
        box["out"] = grad + 1.0
        box["mark"] = h.record("result", (box["out"],))

    t = threading.Thread(target=consumer, name="hgc-test-consumer")
    t.start()
    t.join()
    with torch.cuda.stream(side):
        h.wait(box["mark"], (box["out"],))
        got = box["out"].sum().item()
    assert got == float((src * 2.0 + 1.0).sum().item())
    assert len(mark.events) == 1 and h.seen("wait", "grad") == ["hgc-test-consumer"]
