"""The slow-network harness's layout of nodes (bench/slownet.py, ``per_node``): 2 namespaces of 2
ranks each, limited links between them only. A real run (a small model, a few steps) shows that
``Split_type(COMM_TYPE_SHARED)`` finds the two nodes without any override, that
``pattern="hierarchical"`` and ``pattern="auto"`` (from the launcher's local size) run the
hierarchical exchange there, bitwise equal on every rank, and that the ranks of one node share
their namespace (host name)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gradcomp.bench import slownet

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(240)

PROGRAM = """
import json, os, torch
import horovod_gradcomp as hgc
from mpi4py import MPI
w = MPI.COMM_WORLD
named = [("a", torch.nn.Parameter(torch.zeros(64, 32))), ("b", torch.nn.Parameter(torch.zeros(32)))]
out = {"rank": w.Get_rank(), "host": os.uname().nodename}
for pattern in ("hierarchical", "auto"):
    comp = hgc.Compression.onebit(named, pattern=pattern, lr_warmup_steps=0)
    for step in range(3):
        g = torch.Generator().manual_seed(step * 10 + w.Get_rank())
        res = comp.exchange({n: torch.randn(p.shape, generator=g) for n, p in named})
    flat = torch.cat([r.reshape(-1) for r in res.values()])
    lay = comp.engine.layout
    out[pattern] = {"layout": lay.describe() if lay else None, "source": lay.source if lay else None,
                    "same": all(torch.equal(x, flat) for x in w.allgather(flat)),
                    "intra": comp.stats()["bytes_sent_intra_node"]}
print("<" + json.dumps(out) + ">", flush=True)
"""


def test_builders_lay_out_nodes():
    cmd = slownet.mpirun_command("bridge", 4, ["prog"], per_node=2)
    hosts = cmd[cmd.index("--host") + 1]
    assert hosts == f"{slownet.bridge_address(0)}:2,{slownet.bridge_address(1)}:2"
    assert cmd[cmd.index("btl") + 1] == "tcp,vader,self"
    script = slownet.build_script("bridge", 3, slownet.Link("1gbit"), ["prog"], per_node=2)
    assert f"{slownet.NETNS_PREFIX}1" in script and f"{slownet.NETNS_PREFIX}2" not in script
    assert "2 nodes of 2" in script
    with pytest.raises(ValueError, match="per_node must be a positive int"):
        slownet.build_script("bridge", 4, slownet.Link("1gbit"), ["prog"], per_node=0)
    with pytest.raises(ValueError, match="layout of mode bridge"):
        slownet.build_script("loopback", 4, slownet.Link("1gbit"), ["prog"], per_node=2)


def test_two_nodes_of_two_ranks_run_the_hierarchical_exchange():
    try:
        slownet.check_available("bridge")
    except slownet.NamespacesNotPermitted as exc:
        pytest.skip(str(exc))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    try:
        res = slownet.run("bridge", 4, [sys.executable, "-c", PROGRAM], "100mbit", timeout=180, env=env, per_node=2)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"timed out:\n{exc.stdout}\n{exc.stderr}")
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}\n{res.stderr}"
    rows = [json.loads(chunk.split(">")[0]) for chunk in res.stdout.split("<")[1:]]
    assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3], res.stdout
    hosts = {r["rank"]: r["host"] for r in rows}
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3]
    for r in rows:
        for pattern in ("hierarchical", "auto"):
            got = r[pattern]
            assert got["layout"] == "2 nodes x 2 ranks" and got["source"] == "mpi", (pattern, r)
            assert got["same"] and got["intra"] > 0, (pattern, r)
