"""Count gloo exit aborts of a plain 2-process DDP script, with no horovod_gradcomp in it.

Some PyTorch versions abort a gloo job at exit ("terminate called without an active exception",
exit status 134 or -6) after a clean run. This launches the same minimal DDP script N times
under ``python -m torch.distributed.run --standalone --nproc_per_node 2`` (a model, a few
steps, an all_reduce of a metric, a barrier, destroy_process_group) and prints, as JSON, the
torch version, the launches, and how many exited non-zero and how many printed the abort:

    .venv/bin/python ci/gloo_exit_check.py --launches 50
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

SCRIPT = r"""
import torch, torch.distributed as dist, torch.nn.functional as F
dist.init_process_group("gloo")
torch.manual_seed(dist.get_rank())
model = torch.nn.parallel.DistributedDataParallel(
    torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    opt.zero_grad()
    loss = F.cross_entropy(model(torch.randn(16, 32)), torch.randint(0, 4, (16,)))
    loss.backward()
    opt.step()
metric = loss.detach().clone()
dist.all_reduce(metric)                # a metric, as training scripts log one
dist.barrier()
dist.destroy_process_group()
print("done", dist.get_rank() if dist.is_initialized() else "", flush=True)
"""

ABORT = "terminate called without an active exception"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--launches", type=int, default=50)
    ap.add_argument("--timeout", type=int, default=120, help="seconds per launch")
    args = ap.parse_args(argv)
    import torch

    rcs, aborts, timeouts = collections.Counter(), 0, 0
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        script = os.path.join(tmp, "ddp_plain.py")
        with open(script, "w") as f:
            f.write(SCRIPT)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("PYTHONPATH", None)
        for i in range(args.launches):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", script]
            try:
                p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=args.timeout)
            except subprocess.TimeoutExpired:
                timeouts += 1
                continue
            rcs[p.returncode] += 1
            aborts += ABORT in (p.stdout + p.stderr)
            print(f"launch {i + 1}/{args.launches}: rc={p.returncode}; aborts so far {aborts}", file=sys.stderr,
                  flush=True)
            if p.returncode != 0 and rcs[p.returncode] == 1:
                print(f"launch {i}: rc={p.returncode}\n{p.stderr[-1500:]}", file=sys.stderr)
    print(json.dumps({"torch": torch.__version__, "launches": args.launches, "aborts": aborts,
                      "nonzero_exits": sum(n for rc, n in rcs.items() if rc != 0), "timeouts": timeouts,
                      "exit_codes": dict(rcs), "seconds": round(time.time() - start, 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
