"""Run under ``mpirun -np 2`` on one GPU (ci/gpu_check.sh): ``compression.exchange()`` of CUDA
gradients against the same gradients on the CPU, for every codec and both flat patterns, and the
hierarchical pattern (issue 31) as one node of two ranks (``ranks_per_node=2``: the node's dense
reduce-scatter and allgather of CUDA gradients, the shard codec between nodes trivially) and as
two nodes of one rank (``ranks_per_node=1``: every shard through the inner pattern).

Both ranks share cuda:0. Each case runs two steps (so error feedback / DGC state is used)
on the first 40 ResNet-50 shapes, seeded per rank and step. Checks: every result is a CUDA
tensor, bitwise equal to the CPU path's result (every codec, onebit included: its column
statistics are summed in one fixed order by the CPU and device kernels alike, see
csrc/device/onebit_functors.h; each line prints whether the case was bitwise and the largest
relative difference, and ``run_case`` still lets onebit pass within 1e-6 relative), and the
bytes on the wire (``stats()["bytes_sent"]``) are the same. Rank 0 prints one line per case;
the exit status is 1 when any case failed on any rank.

Then the device exchange (exchange/staging.py, exchange/stream_handoff.py):

* staging: which path the cases above took, from the staging counters. With a CUDA-aware MPI
  (``cuda_aware_mpi()``) the direct path: the four collectives of ``MPICommunicator`` on CUDA
  buffers (results on the device, the right bytes), the cases' payloads through
  ``DirectStaging`` with no copy, and one case again with ``HOROVOD_GRADCOMP_HOST_STAGING=1``
  (host copies, the same bits). Without one: the communicator refuses CUDA buffers with its
  TypeError and the cases staged through the host (the direct path then says SKIPPED, with the
  MPI library's name).
* stream hand-over: gradients written on a side stream behind ``torch.cuda._sleep`` (so an
  exchange that did not wait for that stream would read them unwritten), submitted from that
  stream, exchanged on the engine's ``hgc-exchange`` thread and in pipelined chunks on the wire
  thread, results read on the side stream: bitwise equal to the CPU path, with the hand-over
  counts. Nothing in between synchronizes the device.
"""
from __future__ import annotations

import os
import sys
import time

import torch
from mpi4py import MPI

import horovod_gradcomp as hgc
from horovod_gradcomp.bench.shapes import resnet50_shapes
from horovod_gradcomp.exchange import staging
from horovod_gradcomp.transports import mpi as mpi_transport
from horovod_gradcomp.transports.mpi import MPICommunicator

CASES = [
    ("onebit", "allgather", {}),
    ("onebit", "two_phase", {}),
    ("terngrad", "allgather", {}),
    ("terngrad", "two_phase", {}),
    ("qsgd", "allgather", {"bits": 4}),
    ("qsgd", "two_phase", {"bits": 4}),
    ("qsgd", "allgather", {"bits": 4, "coding": "elias"}),
    ("dgc", "allgather", {"density": 0.01}),
    ("onebit", "hierarchical", {"ranks_per_node": 2}),
    ("terngrad", "hierarchical", {"ranks_per_node": 2}),
    ("dgc", "hierarchical", {"density": 0.01, "ranks_per_node": 2}),
    ("onebit", "hierarchical", {"ranks_per_node": 1}),
    ("qsgd", "hierarchical", {"bits": 4, "coding": "elias", "ranks_per_node": 1}),
]
SHAPES = resnet50_shapes()[:40]


def grads_for(step: int, device: str) -> dict:
    gen = torch.Generator().manual_seed(1000 * step + MPI.COMM_WORLD.rank)
    return {f"p{i}": torch.randn(s, generator=gen).to(device) for i, s in enumerate(SHAPES)}


def run_case(name: str, pattern: str, opts: dict) -> tuple:
    made = {}
    for dev in ("cpu", "cuda"):
        named = [(f"p{i}", torch.nn.Parameter(torch.zeros(s, device=dev))) for i, s in enumerate(SHAPES)]
        made[dev] = hgc.Compression.codec(name, named, pattern=pattern, **opts)
    bitwise, worst, t_gpu = True, 0.0, 0.0
    for step in range(2):
        out_cpu = made["cpu"].exchange(grads_for(step, "cpu"))
        g = grads_for(step, "cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out_gpu = made["cuda"].exchange(g)
        torch.cuda.synchronize()
        t_gpu += time.perf_counter() - t0
        for n, want in out_cpu.items():
            got = out_gpu[n]
            assert got.is_cuda, f"{n}: result on {got.device}"
            got = got.cpu()
            if not torch.equal(got.view(-1).view(torch.uint8), want.view(-1).view(torch.uint8)):
                bitwise = False
                worst = max(worst, ((got - want).abs() / want.abs().clamp_min(1e-30)).max().item())
    sent = (made["cpu"].stats()["bytes_sent"], made["cuda"].stats()["bytes_sent"])
    ok = sent[0] == sent[1] and (bitwise or (name == "onebit" and worst <= 1e-6))
    return ok, bitwise, worst, sent, t_gpu


def staging_counts() -> dict:
    """The counters of the two CUDA stagings of this rank's device."""
    dev = torch.device("cuda", torch.cuda.current_device())
    return {"direct": staging.staging_into(dev, dev).counters(), "host": staging.staging_into(dev, "cpu").counters()}


def check_direct_collectives() -> str:
    """The MPICommunicator collectives on CUDA buffers (needs a CUDA-aware MPI)."""
    mpi = MPICommunicator()
    k, r = mpi.size, mpi.rank
    send = torch.full((5,), 10 + r, dtype=torch.uint8, device="cuda")
    got = mpi.allgather(send)
    assert got.is_cuda and got.cpu().tolist() == [[10 + j] * 5 for j in range(k)], got
    parts = mpi.allgatherv(send[:r + 1])
    assert all(p.is_cuda and p.cpu().tolist() == [10 + j] * (j + 1) for j, p in enumerate(parts)), parts
    parts = mpi.allgatherv_known(send[:r + 1], [j + 1 for j in range(k)])
    assert all(p.is_cuda and p.cpu().tolist() == [10 + j] * (j + 1) for j, p in enumerate(parts)), parts
    recv = mpi.alltoallv(send[:k].clone(), [1] * k, [1] * k)
    assert recv.is_cuda and recv.cpu().tolist() == [10 + j for j in range(k)], recv
    return "allgather, allgatherv, allgatherv_known, alltoallv on CUDA buffers: OK"


def check_staging(before: dict) -> tuple:
    """Which staging the cases took; the direct path's own checks when MPI is CUDA-aware."""
    after = staging_counts()
    moved = {kind: {k: after[kind][k] - before[kind][k] for k in after[kind]} for kind in after}
    if not mpi_transport.cuda_aware_mpi():
        library = MPI.Get_library_version().splitlines()[0]
        try:
            MPICommunicator().allgather(torch.zeros(4, dtype=torch.uint8, device="cuda"))
            refused = "NOT refused (a bug)"
        except TypeError:
            refused = "refused with TypeError"
        ok = moved["direct"]["gathers"] == 0 and moved["host"]["gathers"] > 0 and refused.startswith("refused")
        return ok, (f"direct path SKIPPED: MPI is not CUDA-aware ({library}); the cases staged through the host "
                    f"({moved['host']}); a CUDA buffer to MPICommunicator: {refused}")
    line = check_direct_collectives()
    ok = moved["direct"]["gathers"] > 0 and moved["direct"]["copies"] == 0 and moved["host"]["gathers"] == 0
    os.environ[staging.HOST_STAGING_ENV] = "1"
    try:
        forced_before = staging_counts()["host"]
        forced = run_case("onebit", "allgather", {})
        forced_copies = staging_counts()["host"]["copies"] - forced_before["copies"]
    finally:
        del os.environ[staging.HOST_STAGING_ENV]
    ok = ok and forced[0] and forced_copies > 0
    return ok, (f"direct path: {line}; cases through DirectStaging {moved['direct']}, host staging {moved['host']}; "
                f"{staging.HOST_STAGING_ENV}=1 rerun: ok={forced[0]} bitwise={forced[1]} host copies={forced_copies}")


def run_handoff_case(name: str, opts: dict) -> tuple:
    """Gradients written on a side stream behind a sleep, exchanged on other threads, results read
    on the side stream; vs the CPU path through the same engine steps."""
    shapes = SHAPES[:16]
    made = {dev: hgc.Compression.codec(name, [(f"p{i}", torch.nn.Parameter(torch.zeros(s, device=dev)))
                                              for i, s in enumerate(shapes)], **opts)
            for dev in ("cpu", "cuda")}
    names = [f"p{i}" for i in range(len(shapes))]
    side, bitwise = torch.cuda.Stream(), True
    for step in range(3):
        gen = torch.Generator().manual_seed(1000 * step + MPI.COMM_WORLD.rank)
        host = {n: torch.randn(s, generator=gen) for n, s in zip(names, shapes)}
        for n in reversed(names):
            made["cpu"].engine.submit(n, host[n].clone())
        want = made["cpu"].engine.finish()
        src = {n: g.to("cuda") for n, g in host.items()}
        torch.cuda.synchronize()  # setup only: the sources are ready before the timed part
        with torch.cuda.stream(side):
            torch.cuda._sleep(200_000_000)   # ~0.1 s of GPU time ahead of the gradients' writes
            grads = {n: src[n] * 1.0 for n in names}
            for n in reversed(names):
                made["cuda"].engine.submit(n, grads[n])
            out = made["cuda"].engine.finish()
            got = {n: out[n].to("cpu") for n in names}   # read on the side stream
        for n in names:
            bitwise &= torch.equal(got[n].view(-1).view(torch.uint8), want[n].view(-1).view(torch.uint8))
    h = made["cuda"].engine.handoff
    threads = sorted(set(h.seen("wait", "grad")))
    wire = made["cuda"].engine.driver.wire.handoff.waits["wire-recv"]
    ok = bitwise and "hgc-exchange" in threads and h.waits["result"] == h.records["result"] > 0
    if opts.get("pipeline_bytes") and MPI.COMM_WORLD.size > 1:
        ok = ok and wire > 0
    return ok, (f"bitwise={bitwise} grad waits on {threads} result marks={h.records['result']} "
                f"wire-recv waits={wire}")


HANDOFF_CASES = [
    ("onebit", {"pattern": "allgather", "bucket_bytes": 1 << 20, "overlap": True, "pipeline_bytes": 4096}),
    ("onebit", {"pattern": "two_phase", "bucket_bytes": 1 << 20, "overlap": True, "pipeline_bytes": 4096}),
    ("terngrad", {"pattern": "allgather", "bucket_bytes": 1 << 20, "overlap": True, "pipeline_bytes": None}),
]


def main() -> int:
    comm = MPI.COMM_WORLD
    torch.cuda.set_device(0)
    usable, why = hgc.native_cuda_status()
    if comm.rank == 0:
        print(f"[gpu_exchange_check] -np {comm.size}, {why}; cuda_aware_mpi={mpi_transport.cuda_aware_mpi()}", flush=True)
    failed = 0
    counts_before = staging_counts()
    for name, pattern, opts in CASES:
        try:
            ok, bitwise, worst, sent, t_gpu = run_case(name, pattern, opts)
            line = (f"{name:9s} {pattern:9s} {str(opts):34s} {'OK  ' if ok else 'FAIL'} "
                    f"bitwise={bitwise} max_rel_diff={worst:.2e} bytes_sent cpu={sent[0]} cuda={sent[1]} "
                    f"gpu_exchange_s={t_gpu:.3f}")
        except Exception as exc:  # noqa: BLE001 - reported, then the exit status says it
            ok, line = False, f"{name:9s} {pattern:9s} {str(opts):34s} FAIL {type(exc).__name__}: {exc}"
        all_ok = comm.allreduce(int(ok), op=MPI.MIN)
        failed += 1 - all_ok
        if comm.rank == 0:
            print(f"[gpu_exchange_check] {line}", flush=True)
    checks = [("staging", lambda: check_staging(counts_before))]
    checks += [(f"handoff {name} {opts['pattern']} pipeline={opts['pipeline_bytes']}",
                lambda name=name, opts=opts: run_handoff_case(name, opts)) for name, opts in HANDOFF_CASES]
    for label, check in checks:
        try:
            ok, detail = check()
        except Exception as exc:  # noqa: BLE001 - reported, then the exit status says it
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        all_ok = comm.allreduce(int(ok), op=MPI.MIN)
        failed += 1 - all_ok
        if comm.rank == 0:
            print(f"[gpu_exchange_check] {label}: {'OK  ' if ok else 'FAIL'} {detail}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
