"""Run under ``mpirun -np 2`` on one GPU (ci/gpu_check.sh): ``compression.exchange()`` of CUDA
gradients against the same gradients on the CPU, for every codec and both patterns.

Both ranks share cuda:0. Each case runs two steps (so error feedback / DGC state is used)
on the first 40 ResNet-50 shapes, seeded per rank and step. Checks: every result is a CUDA
tensor, bitwise equal to the CPU path's result (every codec, onebit included: its column
statistics are summed in one fixed order by the CPU and device kernels alike, see
csrc/device/onebit_functors.h; each line prints whether the case was bitwise and the largest
relative difference, and ``run_case`` still lets onebit pass within 1e-6 relative), and the
bytes on the wire (``stats()["bytes_sent"]``) are the same. Rank 0 prints one line per case;
the exit status is 1 when any case failed on any rank.
"""
from __future__ import annotations

import sys
import time

import torch
from mpi4py import MPI

import horovod_gradcomp as hgc
from horovod_gradcomp.bench.shapes import resnet50_shapes

CASES = [
    ("onebit", "allgather", {}),
    ("onebit", "two_phase", {}),
    ("terngrad", "allgather", {}),
    ("terngrad", "two_phase", {}),
    ("qsgd", "allgather", {"bits": 4}),
    ("qsgd", "two_phase", {"bits": 4}),
    ("qsgd", "allgather", {"bits": 4, "coding": "elias"}),
    ("dgc", "allgather", {"density": 0.01}),
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


def main() -> int:
    comm = MPI.COMM_WORLD
    torch.cuda.set_device(0)
    usable, why = hgc.native_cuda_status()
    if comm.rank == 0:
        print(f"[gpu_exchange_check] -np {comm.size}, {why}", flush=True)
    failed = 0
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
