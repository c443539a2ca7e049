"""``bench exchange --breakdown`` under mpirun -np 2 (small shapes, plain mpirun): it runs, every
phase is where it should be, and the phases add up to the step time measured by the bench's
own timer."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gradcomp.bench import exchange_bench as eb

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150
pytestmark = pytest.mark.timeout(TIMEOUT_S + 30)


def test_breakdown_adds_up(tmp_path):
    prefix, rows_path = tmp_path / "bd", tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k not in eb.MPI_ENV and not k.startswith(("OMPI_COMM", "PMIX"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "horovod_gradcomp.bench", "exchange", "--net", "none", "--np", "2",
           "--shapes", "small", "--steps", "3", "--warmup", "1", "--configs", "none,onebit,dgc:density=0.001,onebit:pipeline_bytes=64,"
           "onebit:pattern=hierarchical,ranks_per_node=2",
           "--breakdown", str(prefix), "--json", str(rows_path), "--timeout", str(TIMEOUT_S - 10)]
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"breakdown run timed out\n{exc.stdout}\n{exc.stderr}")
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}\n{res.stderr[-6000:]}"
    assert Path(f"{prefix}.png").read_bytes()[:4] == b"\x89PNG"
    summary = json.loads(Path(f"{prefix}.json").read_text())["configs"]
    rows = {r["config"]: r for r in json.loads(rows_path.read_text())}
    assert [s["config"] for s in summary] == ["none", "onebit", "dgc:density=0.001", "onebit:pipeline_bytes=64",
                                              "onebit:pattern=hierarchical,ranks_per_node=2"]
    for s in summary:
        assert len(s["ranks"]) == 2
        for r in s["ranks"]:
            assert len(r["steps"]) == 3
            for st in r["steps"]:
                main = st["main"]
                assert all(v >= -1e-3 for v in main.values()), main          # nesting is consistent
                assert sum(main.values()) == pytest.approx(st["step_ms"], rel=1e-3, abs=1e-2)
                assert {"zero_grad", "backward", "hooks", "synchronize", "optimizer"} <= set(main)
                if "hierarchical" in s["config"]:   # one node of two: the node steps, recorded
                    assert {"node_scatter", "node_scatter/collective", "node_sum", "encode", "decode",
                            "node_gather", "node_gather/collective"} <= set(main), main
                    assert main["node_scatter/collective"] > 0 and main["node_gather/collective"] > 0
                elif s["config"] == "onebit:pipeline_bytes=64":   # chunks: collectives on the wire thread
                    assert {"decompress", "flush", "preamble", "encode", "wait", "decode"} <= set(main), main
                    wire = [t for name, t in st["threads"].items() if name.startswith("hgc-wire")]
                    assert len(wire) == 1 and wire[0]["wire/collective"] > 0, st["threads"]
                elif s["config"] != "none":     # the codec's exchange runs in the first decompress
                    assert {"decompress", "flush", "preamble", "preamble/collective", "encode",
                            "exchange/collective", "decode"} <= set(main), main
                    assert main["encode"] > 0 and main["exchange/collective"] > 0
                if s["config"].startswith("onebit") and "hierarchical" not in s["config"]:  # the non-finite check is the encode's first pass
                    assert "nonfinite" not in main and main["measure"] > 0, main
                elif s["config"].startswith("dgc"):   # DGC without clipping keeps its read of the gradients
                    assert main["nonfinite"] > 0 and "measure" not in main, main
        # the step spans agree with the bench's own timer (slowest rank per step, median)
        slowest = [max(r["steps"][i]["step_ms"] for r in s["ranks"]) for i in range(3)]
        assert statistics.median(slowest) == pytest.approx(rows[s["config"]]["ms_per_step"], rel=0.1, abs=2.0)
    assert "synchronize" in res.stdout and "encode" in res.stdout      # the breakdown table
    # the floor of each codec from the same run: the local (no communication) step plus encode + decode
    floors = {f["config"]: f for f in json.loads(Path(f"{prefix}.json").read_text())["floors"]}
    assert set(floors) == {"onebit", "dgc:density=0.001", "onebit:pipeline_bytes=64",
                           "onebit:pattern=hierarchical,ranks_per_node=2"} and "local" in rows
    for f in floors.values():
        assert f["local_ms"] == rows["local"]["ms_per_step"] and f["codec_ms"] > 0
        assert f["floor_ms"] == pytest.approx(f["local_ms"] + f["codec_ms"], abs=1e-3)   # no link limit here
        assert f["vs_floor"] == pytest.approx(f["ms_per_step"] / f["floor_ms"], rel=1e-2)
