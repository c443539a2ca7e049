"""``bench memory``: the state each codec holds, found on the objects, against the sizes the
algorithms imply (one residual per value for error feedback, a velocity and an accumulation
for DGC, 1/K of the model of owner residuals for two-phase)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from horovod_gradcomp.bench import exchange_bench as eb
from horovod_gradcomp.bench import memory_bench as mb
from one_rank import OneRank

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150


def _named(shapes):
    return [(f"t{i}", torch.nn.Parameter(torch.zeros(s))) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("name, expected", [("onebit", {"residuals": 1.0}),
                                            ("dgc", {"dgc_velocity": 1.0, "dgc_accumulation": 1.0})])
def test_held_state_in_process(name, expected):
    import horovod_gradcomp as hgc
    named = _named([(30, 20), (17,), (8, 3, 3, 3)])
    if name == "dgc":
        comp = hgc.Compression.dgc(named, density=0.1, momentum=0.9, check_optimizer=False, communicator=OneRank())
    else:
        comp = hgc.Compression.codec(name, named, communicator=OneRank())
    for step in range(2):
        comp.exchange({n: torch.randn(p.shape) for n, p in named})
    model = sum(4 * p.numel() for _, p in named)
    held = mb.held_tensors(comp, {mb._storage_key(p) for _, p in named})
    assert {k: v / model for k, v in held.items() if v} == expected


def test_memory_run_under_mpirun(tmp_path):
    out = tmp_path / "mem.json"
    env = {k: v for k, v in os.environ.items() if k not in eb.MPI_ENV and not k.startswith(("OMPI_COMM", "PMIX"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "horovod_gradcomp.bench", "memory", "--np", "2", "--shapes", "small", "--steps", "2",
           "--configs", "onebit,onebit:pattern=two_phase,dgc:density=0.001,dgc:density=0.001,momentum=0.9,onebit:pipeline_bytes=64",
           "--json", str(out),
           "--timeout", str(TIMEOUT_S - 10)]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert res.returncode == 0, res.stderr[-4000:]
    rows = {r["config"]: r for r in json.loads(out.read_text())}
    assert rows["onebit"]["x_model"]["residuals"] == 1.0 and "owner_residuals" not in rows["onebit"]["x_model"]
    assert rows["onebit:pattern=two_phase"]["x_model"]["owner_residuals"] == pytest.approx(0.5, abs=0.01)
    # momentum 0 (the bench's plain SGD): the accumulation only; with momentum, the velocity too
    assert rows["dgc:density=0.001"]["x_model"]["held_total"] == 1.0
    assert rows["dgc:density=0.001,momentum=0.9"]["x_model"]["held_total"] == 2.0
    onebit = rows["onebit"]
    # 1-bit payloads are about 1/32 of fp32; at K=2 the allgather receives 2 payloads and sends 1
    assert 0.02 < onebit["x_model"]["payloads_per_step"] < 0.1
    assert onebit["buffers_per_step_bytes"] >= 3 * onebit["payload_per_step_bytes"]
    # pipelined chunks: the wire thread's collectives are recorded too (same bytes, in chunks)
    piped = rows["onebit:pipeline_bytes=64"]
    assert piped["buffers_per_step_bytes"] >= 3 * piped["payload_per_step_bytes"] > 0
