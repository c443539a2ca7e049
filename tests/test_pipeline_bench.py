"""The ``pipeline`` benchmark: argument checks in process, and tiny runs under mpirun -np 2
without the network harness (``--net none``) checking the JSON keys (not the timings)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gradcomp.bench import pipeline_bench as pb
from horovod_gradcomp.bench.__main__ import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150
pytestmark = pytest.mark.timeout(TIMEOUT_S + 30)


def test_registered_with_its_options():
    args = build_parser().parse_args(["pipeline", "--json", "--net", "none", "--batch", "8"])
    assert args.command == "pipeline" and args.json and args.batch == 8 and args.codec == "onebit"


@pytest.mark.parametrize("bad", [["--batch", "7"], ["--batch", "0"], ["--steps", "0"], ["--warmup", "-1"]])
def test_bad_arguments_fail_before_launching(bad, capsys):
    assert main(["pipeline", "--net", "none", *bad]) == 2
    assert "error" in capsys.readouterr().err


def test_worker_argv_carries_the_settings():
    args = build_parser().parse_args(["pipeline", "--net", "loopback", "--rate", "1gbit", "--width", "64",
                                      "--poll-us", "500"])
    argv = pb.worker_argv(args, "/tmp/x.json")
    assert argv[argv.index("--width") + 1] == "64" and argv[argv.index("--rate") + 1] == "1gbit"
    assert argv[argv.index("--poll-us") + 1] == "500.0" and argv[argv.index("--out") + 1] == "/tmp/x.json"


@pytest.mark.parametrize("codec", ["onebit", "none"])
def test_tiny_run_prints_the_json_last(codec):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "horovod_gradcomp.bench", "pipeline", "--net", "none", "--codec", codec,
           "--width", "32", "--depth", "1", "--batch", "8", "--steps", "2", "--warmup", "1", "--rounds", "1",
           "--timeout", str(TIMEOUT_S), "--json"]
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S + 20)
    assert res.returncode == 0, res.stdout + res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    for key in (*pb.KEYS, "full_batch_ms", "update_ms", "target_met", "double_buffering_pays"):
        assert key in summary, key
    assert all(summary[k] > 0 for k in pb.KEYS)
    assert summary["ranks"] == 2 and summary["codec"] == codec
