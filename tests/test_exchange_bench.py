"""Tests of the ``exchange`` benchmark: config parsing, rows and output (in process), and
one tiny run under mpirun -np 2 without the network harness (about 20 s on 2 cores)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from horovod_gradcomp.bench import exchange_bench as eb
from horovod_gradcomp.bench.__main__ import build_parser

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 150
pytestmark = pytest.mark.timeout(TIMEOUT_S + 30)


# -- configs --------------------------------------------------------------------------

def test_split_and_parse_configs():
    text = "none, fp16,onebit:pattern=two_phase,qsgd:bits=4,bucket=512,dgc:density=0.001"
    assert eb.split_configs(text) == ["none", "fp16", "onebit:pattern=two_phase", "qsgd:bits=4,bucket=512",
                                      "dgc:density=0.001"]
    cfg = eb.parse_config("qsgd:bits=4,bucket=512:coding=elias")
    assert (cfg.name, cfg.options) == ("qsgd", {"bits": 4, "bucket": 512, "coding": "elias"})
    assert eb.parse_config("dgc:density=0.001").options == {"density": 0.001}
    with pytest.raises(ValueError):
        eb.parse_config("qsgd:bits")


def test_default_configs_follow_the_adapter(monkeypatch):
    import horovod_gradcomp as hgc
    # each fixed-size codec also runs with the pattern that is not its default
    two_phase = {"onebit:pattern=allgather", "terngrad:pattern=allgather", "qsgd:bits=4,pattern=allgather"}
    monkeypatch.setattr(eb, "adapter_accepts", lambda option: True)
    configs, left_out = eb.default_configs()
    assert configs[:2] == ["none", "fp16"] and not left_out
    assert {"onebit", "terngrad", "qsgd:bits=4", "dgc:density=0.001"} | two_phase <= set(configs)
    assert not any(c.startswith("dgc") and "pattern" in c for c in configs)   # variable-size: allgather only
    ddp = len(eb.ddp_rows.DEFAULT_ROWS) if eb.ddp_rows.available() else 0    # DDP + PowerSGD rows
    assert len(configs) == 2 + len(hgc.available_codecs()) + len(two_phase) + ddp
    monkeypatch.setattr(eb, "adapter_accepts", lambda option: False)
    configs, left_out = eb.default_configs()
    assert not any("pattern" in c for c in configs) and len(left_out) == len(two_phase)


def test_make_compression_rejects_bad_configs():
    named = []
    with pytest.raises(ValueError, match="unknown codec"):
        eb.make_compression(eb.parse_config("zip"), named)
    with pytest.raises(ValueError, match="takes no options"):
        eb.make_compression(eb.parse_config("fp16:bits=8"), named)


# -- rows and output ------------------------------------------------------------------

def _fake_rank(ms, sent, dense=4e6):
    return {"seconds": [m / 1e3 for m in ms], "factory": "Compression.x", "bytes_sent": sent, "bytes_dense": dense}


def test_summarize_takes_the_slowest_rank_per_step():
    cfg = eb.parse_config("onebit")
    row = eb.summarize(cfg, [_fake_rank([10, 30, 20], 1e5), _fake_rank([20, 10, 40], 3e5)], 2, 10**6,
                       "loopback", "1gbit", steps=3, warmup=1)
    assert row["ms_per_step"] == 30.0 and row["ms_min"] == 20.0      # max per step: 20, 30, 40
    assert row["bytes_sent_per_step"] == 200_000 and row["wire_ratio"] == 20.0
    assert row["link_ms"] == pytest.approx(2 * 8 * 2e5 / 1e9 * 1e3)  # loopback: both ranks on one link
    skipped = eb.summarize(cfg, [{"error": "TypeError: x"}] * 2, 2, 10, "none", None, 3, 1)
    assert skipped["skipped"] == "TypeError: x" and "ms_per_step" not in skipped


def test_link_ms_per_layout():
    assert eb.link_ms(1e6, 4, "bridge", 1e9) == 8.0
    assert eb.link_ms(1e6, 4, "loopback", 1e9) == 32.0
    assert eb.link_ms(1e6, 4, "none", None) is None


def test_table_and_plot(tmp_path):
    rows = []
    for rate, scale in (("1gbit", 1.0), ("10gbit", 0.3)):
        for cfg, ms, sent in (("none", 1700, 1e8), ("onebit", 400, 3.6e6)):
            r = eb.summarize(eb.parse_config(cfg), [_fake_rank([ms * scale], sent, 1e8)], 2, 25_557_032,
                             "loopback", rate, steps=1, warmup=0)
            rows.append(r)
    rows.append(eb.summarize(eb.parse_config("onebit:pattern=x"), [{"error": "TypeError: no"}], 2, 1, "loopback",
                             "1gbit", 1, 0))
    table = eb.format_table(rows)
    assert "4.25x" in table and "skipped: onebit:pattern=x" in table
    png = tmp_path / "p.png"
    assert eb.write_plot(rows, str(png)) and png.read_bytes()[:4] == b"\x89PNG"
    assert not eb.write_plot([r for r in rows if False], str(tmp_path / "none.png"))


def test_command_is_registered():
    args = build_parser().parse_args(["exchange", "--np", "4", "--net", "bridge", "--rates", "1gbit,10gbit"])
    assert (args.np, args.net, args.rates) == (4, "bridge", "1gbit,10gbit")
    worker = eb.worker_argv(args, ["none", "qsgd:bits=4"], "1gbit", "/tmp/x.json")
    assert worker[1:4] == ["-m", "horovod_gradcomp.bench", "exchange"] and "--worker" in worker
    assert worker[worker.index("--rates") + 1] == "1gbit" and worker[worker.index("--net") + 1] == "bridge"


# -- a real run -----------------------------------------------------------------------

def test_tiny_run_under_mpirun(tmp_path):
    """Every default config measured at K=2 (plain mpirun, small shapes): positive times, the
    bytes each config should send, and the launcher's table."""
    out = tmp_path / "rows.json"
    env = {k: v for k, v in os.environ.items() if k not in eb.MPI_ENV and not k.startswith(("OMPI_COMM", "PMIX"))}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "horovod_gradcomp.bench", "exchange", "--net", "none", "--np", "2",
           "--shapes", "small", "--steps", "2", "--warmup", "1", "--json", str(out), "--timeout", str(TIMEOUT_S - 10)]
    try:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"exchange bench timed out\n{exc.stdout}\n{exc.stderr}")
    assert res.returncode == 0, f"rc {res.returncode}\n{res.stdout}\n{res.stderr[-6000:]}"
    rows = json.loads(out.read_text())
    expected, _ = eb.default_configs()
    assert [r["config"] for r in rows] == expected
    by = {r["config"]: r for r in rows}
    for r in rows:
        assert "skipped" not in r, r
        assert r["k"] == 2 and r["net"] == "none" and r["numel"] == eb.total_numel(eb.SMALL_SHAPES)
        assert 0 < r["ms_min"] <= r["ms_per_step"] < 60_000, r
        assert r["bytes_sent_per_step"] > 0 and r["bytes_dense_per_step"] > 0, r
    dense = by["none"]["bytes_sent_per_step"]
    assert dense == pytest.approx(4 * by["none"]["numel"])                # ring allreduce at K=2: 2(K-1)/K * 4n
    assert by["fp16"]["bytes_sent_per_step"] == pytest.approx(dense / 2)
    assert by["onebit"]["wire_ratio"] > 10 and by["dgc:density=0.001"]["wire_ratio"] > 50
    assert "config" in res.stdout and "vs none" in res.stdout       # the launcher's table
    if eb.ddp_rows.available():   # PowerSGD's own count of what it allreduced = the hook's rule on the shapes
        from horovod_gradcomp.bench.cost_model import powersgd_factor_bytes
        for r in (1, 4):
            row = by[f"ddp_powersgd:rank={r}"]
            assert not row.get("bytes_computed") and row["bytes_sent_per_step"] == powersgd_factor_bytes(eb.SMALL_SHAPES, r)
