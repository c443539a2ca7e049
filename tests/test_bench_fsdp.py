"""bench fsdp (step time) and bench fsdp-accuracy: option checks, the tables' arithmetic, and
``bench fsdp --quick`` end to end on the loopback harness (K=2, 3 steps)."""
from __future__ import annotations

import argparse
import json

import pytest

from horovod_gradcomp.bench import fsdp_accuracy, fsdp_bench, slownet
from horovod_gradcomp.bench.__main__ import main
from horovod_gradcomp.bench.fsdp_step_worker import hsdp_dgc_options


def test_bad_options_name_the_problem(capsys):
    assert main(["fsdp", "--quick", "--codecs", "onebit,bogus"]) == 2
    assert "--codecs: unknown ['bogus']" in capsys.readouterr().err
    assert main(["fsdp", "--quick", "--layouts", "zero3"]) == 2
    assert "--layouts: unknown ['zero3']" in capsys.readouterr().err
    assert main(["fsdp", "--np", "4", "--nodes", "3", "--layouts", "hsdp"]) == 2
    assert "the 4 ranks must split into --nodes 3" in capsys.readouterr().err
    assert main(["fsdp", "--np", "2", "--nodes", "2", "--layouts", "hsdp"]) == 2   # nodes of one rank
    assert "of 2 or more ranks" in capsys.readouterr().err
    assert main(["fsdp-accuracy", "--optimizers", "lamb"]) == 2
    assert "--optimizers: unknown ['lamb']" in capsys.readouterr().err
    assert main(["fsdp-accuracy", "--codecs", "zip"]) == 2
    assert "--codecs: unknown ['zip']" in capsys.readouterr().err


def test_dgc_gets_its_momentum_in_hsdp_only():
    sgd = argparse.Namespace(hsdp=2, optimizer="sgd")
    assert hsdp_dgc_options("dgc", sgd) == {"momentum": 0.9}
    assert hsdp_dgc_options("dgc", argparse.Namespace(hsdp=2, optimizer="adamw")) == {"momentum": 0.0}
    assert hsdp_dgc_options("dgc", argparse.Namespace(hsdp=0, optimizer="sgd")) == {}
    assert hsdp_dgc_options("onebit", sgd) == {}


def _step_row(row, layout, rate, ms):
    return {"row": row, "layout": layout, "rate": rate, "median_ms": ms}


def test_step_table_compares_within_each_run():
    rows = [_step_row("none", "sharded", "100mbit", 300.0), _step_row("onebit", "sharded", "100mbit", 120.0),
            _step_row("none", "hsdp", "1gbit", 50.0), _step_row("onebit", "hsdp", "1gbit", 100.0)]
    text = fsdp_bench.table(rows)
    assert "| exchange | sharded 100mbit ms | vs dense | hsdp 1gbit ms | vs dense |" in text
    assert "| FSDP2 dense (fp32) | 300.0 | 1.00x | 50.0 | 1.00x |" in text
    assert "| onebit | 120.0 | 2.50x | 100.0 | 0.50x |" in text


def _acc_row(path, codec, opt, test, last=2.0, finite=True):
    return {"path": path, "codec": codec, "optimizer": opt, "test_loss": test, "last_loss": last, "finite": finite}


def test_accuracy_table_gap_and_ddp_comparison():
    rows = [_acc_row("fsdp", "none", "sgd", 2.00), _acc_row("fsdp", "onebit", "sgd", 2.08),
            _acc_row("fsdp", "qsgd", "sgd", 2.12), _acc_row("fsdp", "dgc", "sgd", 9.0, finite=False),
            dict(_acc_row("ddp", "onebit", "sgd", 2.10), pattern="two_phase"),
            dict(_acc_row("ddp", "qsgd", "sgd", 2.00), pattern="two_phase")]
    text = fsdp_accuracy.table(rows)
    assert "| sgd | FSDP2 dense (fp32 reduce-scatter) | 2.000 | 2.000 | - | - | - | - |" in text
    assert "| sgd | onebit (sharded) | 2.080 | 2.000 | +4.0% | yes | 2.100 (two_phase) | yes |" in text
    assert "| sgd | qsgd (sharded) | 2.120 | 2.000 | +6.0% | no | 2.000 (two_phase) | no (+6.0%) |" in text
    assert "| sgd | dgc (sharded) | diverged |" in text


def test_accuracy_plan_runs_dense_then_sharded_then_ddp():
    args = argparse.Namespace(codecs="onebit,dgc", optimizers="sgd", np=4, steps=200, ddp_pattern="two_phase",
                              seed=0)
    runs = fsdp_accuracy.plan(args)
    assert [(r["path"], r["codec"]) for r in runs] == [("fsdp", "none"), ("fsdp", "onebit"), ("fsdp", "dgc"),
                                                       ("ddp", "onebit"), ("ddp", "dgc")]
    assert [r.get("pattern") for r in runs[3:]] == ["two_phase", "allgather"]   # DGC has no two-phase pattern
    argv = fsdp_accuracy.run_argv(args, runs[-1])
    assert argv[-2:] == ["--pattern", "allgather"] and argv[argv.index("--nproc_per_node") + 1] == "4"
    assert argv[argv.index("--codec") + 1] == "dgc"
    assert argv[argv.index("--nproc_per_node") + 2].endswith("examples/train_lm_ddp.py")
    with pytest.raises(ValueError, match="--steps >= 20"):
        fsdp_accuracy.plan(argparse.Namespace(**{**vars(args), "steps": 5}))


@pytest.mark.timeout(240)
def test_quick_runs_end_to_end(tmp_path, capsys):
    """--quick on the loopback harness at 1 Gbit/s, K=2: dense FSDP2 and onebit each time 3 steps; onebit
    sends fewer bytes than FSDP2's dense reduce-scatter; the table is written and made again from the JSON."""
    try:
        slownet.check_available("loopback")
    except slownet.NamespacesNotPermitted as exc:
        pytest.skip(str(exc))
    out, md = tmp_path / "fsdp.json", tmp_path / "fsdp.md"
    assert main(["fsdp", "--quick", "--timeout", "200", "--json", str(out), "--markdown", str(md)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["row"] for r in rows] == ["none", "onebit"]
    for r in rows:
        assert r["k"] == 2 and r["rate"] == "1gbit" and r["layout"] == "sharded" and r["hsdp"] == 0
        assert len(r["step_ms"]) == 3 and all(t > 0 for t in r["step_ms"]) and r["median_ms"] in r["step_ms"]
    onebit = rows[1]
    assert onebit["mode"] == "sharded" and onebit["memory_bytes"] > 0
    dense_bytes = 4 * onebit["parameters"] / 2          # FSDP2's reduce-scatter at K=2: half the fp32 gradient
    assert 0 < onebit["bytes_sent_per_step"] < dense_bytes / 4
    text = md.read_text()
    assert text.startswith("# FSDP2 step time") and "commit " in text and "| FSDP2 dense (fp32) |" in text
    capsys.readouterr()
    assert main(["fsdp", "--from-json", str(out)]) == 0
    assert "| onebit |" in capsys.readouterr().out


@pytest.mark.timeout(300)
def test_ddp_example_matches_fsdp_dense_and_runs_two_phase():
    """examples/train_lm_ddp.py trains the FSDP2 example's model on the same data: DDP's dense
    allreduce gives FSDP2's dense losses; a codec runs through the hook's two-phase pattern."""
    from launchers import last_json, run, torchrun
    common = ("--optimizer", "sgd", "--steps", "20", "--json")
    fsdp = last_json(run(torchrun(2, "examples/train_fsdp.py", "--codec", "none", *common), timeout=250))
    ddp = last_json(run(torchrun(2, "examples/train_lm_ddp.py", "--codec", "none", *common), timeout=250))
    assert ddp["path"] == "ddp" and ddp["parameters"] == fsdp["parameters"]
    assert ddp["first_loss"] == pytest.approx(fsdp["first_loss"], rel=1e-5)
    assert ddp["last_loss"] == pytest.approx(fsdp["last_loss"], rel=1e-4)
    assert ddp["test_loss"] == pytest.approx(fsdp["test_loss"], rel=1e-4)
    onebit = last_json(run(torchrun(2, "examples/train_lm_ddp.py", "--codec", "onebit", *common), timeout=250))
    assert onebit["pattern"] == "two_phase" and onebit["finite"] and onebit["stats"]["steps"] == 20
