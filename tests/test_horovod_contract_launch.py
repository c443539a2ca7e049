"""Horovod's contract, launched for real under mpirun with a timeout per job:

* the crash loop: short -np 2 jobs that build a compression (every codec, ``none``, ``fp16``)
  and an ``hvd.DistributedOptimizer`` and end in different ways (normally, right after
  building, by Horovod's ValueError before the first step, by an exception after one step);
  no job may die of a signal or print a native crash. ``HGC_CRASH_LOOP_JOBS`` sets the number
  of jobs (default 8; the acceptance run is ``HGC_CRASH_LOOP_JOBS=600``, 100 per factory);
* a process-set model built on every rank at -np 3 and 4 (tests/launch/process_set_everywhere.py);
* ranks that cannot agree through an error: the job ends with ``StallError`` and the MPI abort
  within the stall timeout, never a hang.
"""
from __future__ import annotations

import itertools
import os
import re
import subprocess
import time

import pytest

from launchers import ROOT, env, mpirun, run

FACTORIES = ["onebit", "terngrad", "qsgd", "dgc", "none", "fp16"]
ENDINGS = {"normal": 0, "built": 0, "duplicate": 1, "one-step": 1}  # ending -> exit status
JOB_TIMEOUT = 120
CRASH = re.compile(r"Segmentation fault|signal 11|SIGSEGV|Fatal Python error|exited on signal|core dumped")


def crash_loop_jobs() -> list:
    """(factory, ending) of each job: every factory with every ending in turn."""
    n = int(os.environ.get("HGC_CRASH_LOOP_JOBS", "8"))
    pairs = [(f, e) for e in ENDINGS for f in FACTORIES]
    cycle = itertools.cycle(pairs)
    return [next(cycle) for _ in range(n)]


def run_job(cmd: list, timeout: int) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(cmd)} hung for {timeout}s\nstdout:\n{e.stdout}\nstderr:\n{e.stderr}")


@pytest.mark.timeout(JOB_TIMEOUT * 700)
def test_crash_loop():
    failures = []
    for i, (factory, ending) in enumerate(crash_loop_jobs()):
        proc = run_job(mpirun(2, "tests/launch/short_job.py", factory, ending), JOB_TIMEOUT)
        out = proc.stdout + proc.stderr
        finished = out.count(f"finished {factory} {ending}")
        expected_rc, expected_finished = ENDINGS[ending], (2 if ENDINGS[ending] == 0 else 0)
        if CRASH.search(out) or (proc.returncode != 0) != (expected_rc != 0) or finished != expected_finished:
            failures.append(f"job {i} ({factory}, {ending}): rc={proc.returncode}, {finished} ranks finished\n"
                            f"{out[-3000:]}")
        if ending == "duplicate" and "ValueError" not in out:
            failures.append(f"job {i} ({factory}, duplicate): no ValueError from Horovod\n{out[-3000:]}")
    assert not failures, "\n\n".join(failures)


@pytest.mark.timeout(2 * 300)
@pytest.mark.parametrize("np_", [3, 4])
def test_process_set_model_built_on_every_rank(np_):
    proc = run(mpirun(np_, "tests/launch/process_set_everywhere.py"), 300)
    assert "OK for" in proc.stdout


STALL_TIMEOUT = 3
STALL_PROGRAM = """
import torch, horovod.torch as hvd, horovod_gradcomp as hgc
CASE, ONE_ELEMENT, TIMEOUT = @CASE@, @ONE_ELEMENT@, @TIMEOUT@
hvd.init()
torch.manual_seed(0)
class One(torch.nn.Module):  # one gradient of shape (1,): the codec's placeholder's shape
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(1))
    def forward(self, x):
        return x * self.w
model = One() if ONE_ELEMENT else torch.nn.Linear(4, 3)
rank = hvd.rank()
if CASE == "transports":
    comp = hgc.Compression.onebit(model.named_parameters(), transport="mpi" if rank == 0 else "horovod",
                                  timeout=TIMEOUT)
else:
    comp = None if rank == 0 else hgc.Compression.onebit(model.named_parameters(), timeout=TIMEOUT)
kw = {} if comp is None else {"compression": comp}
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), **kw)
model(torch.randn(2, 4)).sum().backward()
opt.step()
print("finished", rank, flush=True)
"""


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 4])
@pytest.mark.parametrize("case", ["transports", "plain-one-element"])
def test_disagreement_without_a_common_collective_ends_in_the_stall_abort(case, np_):
    """Rank 0 exchanges over mpi4py while the others use Horovod's collectives; or rank 0 runs
    plain Horovod on a model whose only gradient has 1 element (so Horovod's shape check cannot
    tell it from the codec's placeholder). No collective is common to both sides, so no rank can
    raise: the watchdog aborts the job within the timeout."""
    program = (STALL_PROGRAM.replace("@CASE@", repr(case.split("-")[0]))
               .replace("@ONE_ELEMENT@", str(case != "transports")).replace("@TIMEOUT@", str(STALL_TIMEOUT)))
    t0 = time.monotonic()
    proc = run_job(mpirun(np_, "-c", program), 150)
    elapsed, out = time.monotonic() - t0, proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the job did not fail:\n{out[-4000:]}"
    assert "StallError" in out and "step 0, bucket all" in out, out[-4000:]
    assert not CRASH.search(out), out[-4000:]
    assert elapsed < 100, f"the job took {elapsed:.0f} s to end"


FINALIZE_PROGRAM = """
import time, torch
import horovod_gradcomp as hgc  # before hvd.init(), as the README asks
import horovod.torch as hvd
hvd.init()
from mpi4py import MPI
hvd.allreduce(torch.ones(1), name="probe")
if hvd.rank() == 1:
    time.sleep(4)  # rank 0 has exited (and shut Horovod down) meanwhile
    print("MPI finalized under a running rank:", MPI.Is_finalized(), flush=True)
"""


@pytest.mark.timeout(150)
def test_another_ranks_exit_does_not_finalize_mpi_under_this_one():
    """The root of the crashes: when hvd.init() initializes MPI, Horovod's background thread
    finalizes it as soon as any rank shuts Horovod down, while this rank's main thread may be
    inside an exchange. Imported first, horovod_gradcomp initializes MPI, and it stays up."""
    proc = run(mpirun(2, "-c", FINALIZE_PROGRAM), 120)
    assert "MPI finalized under a running rank: False" in proc.stdout, proc.stdout + proc.stderr


PARAM_SETS_PROGRAM = """
import torch, horovod.torch as hvd, horovod_gradcomp as hgc
hvd.init()
torch.manual_seed(0)
class Net(torch.nn.Module):  # the same names on every rank, plus "extra" on rank 0
    def __init__(self, extra):
        super().__init__()
        self.extra = torch.nn.Linear(4, 4) if extra else None
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)
    def forward(self, x):
        return self.b(self.a(self.extra(x) if self.extra is not None else x))
model = Net(hvd.rank() == 0)
comp = hgc.Compression.onebit(model.named_parameters(), timeout=20)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), compression=comp)
model(torch.randn(2, 4)).sum().backward()
try:
    opt.step()
except hgc.ExchangeMismatchError as e:
    print(f"rank {hvd.rank()}: ExchangeMismatchError: {e}"[:200], flush=True)
    raise SystemExit(3)
print("finished", hvd.rank(), flush=True)
"""


@pytest.mark.timeout(200)
@pytest.mark.parametrize("np_", [2, 4])
def test_different_parameter_sets_through_the_optimizer_fail_on_every_rank(np_):
    """Rank 0's model has an extra first layer (its hook fires last and the other names are
    the same on every rank, so every rank's first synchronized gradient is a common one and
    every rank reaches the exchange): the preamble names the disagreement on every rank.
    (Had the first synchronized gradient been one that only rank 0 has, rank 0 would wait in
    Horovod and the others end in the stall abort: tests above.)"""
    proc = run_job(mpirun(np_, "-c", PARAM_SETS_PROGRAM), 150)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "finished" not in out, out[-4000:]
    for r in range(np_):
        assert f"rank {r}: ExchangeMismatchError" in out, out[-4000:]
    assert not CRASH.search(out), out[-4000:]


FAIL_MID_STEP_PROGRAM = """
import torch, horovod.torch as hvd, horovod_gradcomp as hgc
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(*[torch.nn.Linear(32, 32) for _ in range(4)])
comp = hgc.Compression.onebit(model.named_parameters(), bucket_bytes=4096, overlap=True, timeout=90)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(), compression=comp)
for step in range(3):
    if step == 2 and hvd.rank() == 0:
        raise RuntimeError("rank 0 fails between steps")
    opt.zero_grad()
    model(torch.randn(8, 32)).sum().backward()  # from step 1 on, buckets leave from the communication thread
    opt.step()
"""


@pytest.mark.timeout(200)
def test_a_rank_failing_mid_step_ends_the_job_without_a_crash():
    """Rank 0 raises between steps; rank 1's communication thread is already waiting in the next
    step's first bucket when Horovod's shutdown reaches its main thread. Its exit must not
    finalize MPI under that thread: it aborts the job with a message, long before the stall
    timeout (90 s)."""
    t0 = time.monotonic()
    proc = run_job(mpirun(2, "-c", FAIL_MID_STEP_PROGRAM), 150)
    elapsed, out = time.monotonic() - t0, proc.stdout + proc.stderr
    assert proc.returncode != 0 and "rank 0 fails between steps" in out, out[-4000:]
    # Two orders are legitimate, depending on scheduling: rank 1's communication thread is
    # already inside the next bucket's exchange (the exit aborts, naming it), or Horovod's
    # shutdown reaches rank 1's main thread first (its own error, before any exchange starts).
    assert "still inside an exchange" in out or "Horovod has been shut down" in out, out[-4000:]
    assert not CRASH.search(out), out[-4000:]
    assert "StallError" not in out and elapsed < 80, f"{elapsed:.0f} s\n{out[-4000:]}"
