"""bench tta: the model, the rows' checks, the target and table arithmetic, and ``--quick`` end to end."""
from __future__ import annotations

import json
import math

import pytest
import torch

from horovod_gradcomp.bench import slownet
from horovod_gradcomp.bench.__main__ import main
from horovod_gradcomp.bench.tta_model import SIZES, CharTransformer, lm_loss, parameter_count
from horovod_gradcomp.bench.tta_report import (README_BEGIN, README_END, add_targets, compact_table,
                                               first_at_or_below, replace_block, table)
from horovod_gradcomp.bench.tta_rows import REFERENCE, all_rows, check_rows


def test_model_is_causal_and_sized():
    """A change at position t leaves the logits before t alone; the full run's model has 1-5 M parameters."""
    torch.manual_seed(0)
    model = CharTransformer(50, SIZES["tiny"]).eval()
    x = torch.randint(0, 50, (2, 16))
    y = x.clone()
    y[:, 10] = (y[:, 10] + 1) % 50
    a, b = model(x), model(y)
    assert torch.equal(a[:, :10], b[:, :10]) and not torch.equal(a[:, 10:], b[:, 10:])
    assert 1_000_000 <= parameter_count(CharTransformer(103, SIZES["small"])) <= 5_000_000
    assert lm_loss(model, torch.randint(0, 50, (3, 17))).item() == pytest.approx(math.log(50), rel=0.3)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_rows_are_checked():
    codecs = ["onebit", "dgc"]
    rows = all_rows(codecs)
    assert rows[0] == REFERENCE and "ddp:powersgd4" in rows and "hvd:dgc" in rows and "ddp:onebit" in rows
    assert check_rows(["hvd:fp32", "ddp:dgc", "hvd:fp32"], codecs) == ["hvd:fp32", "ddp:dgc"]
    with pytest.raises(ValueError, match=r"unknown rows \['hvd:bogus'\]"):
        check_rows(["hvd:fp32", "hvd:bogus"], codecs)
    with pytest.raises(ValueError, match="include the row hvd:fp32"):
        check_rows(["ddp:allreduce"], codecs)


def _row(name, losses, seconds, rate="1gbit", opt="sgd"):
    points = [{"step": 10 * i, "seconds": s, "loss": v} for i, (v, s) in enumerate(zip(losses, seconds))]
    return {"row": name, "optimizer": opt, "rate": rate, "points": points, "final_loss": losses[-1]}


def test_targets_and_table():
    """The target is fp32's final loss + 2%; the time to it is the first evaluation at or below."""
    rows = [_row("hvd:fp32", [4.0, 2.5, 2.0], [0, 10, 20]),
            _row("hvd:onebit", [4.0, 2.03, 1.9], [0, 4, 8]),          # 2.03 <= 2.04: reached at 4 s
            _row("ddp:powersgd1", [4.0, 3.0, 2.5], [0, 5, 10])]        # never reaches 2.04
    add_targets(rows)
    fp32, onebit, psgd = rows
    assert fp32["target_loss"] == pytest.approx(2.04)
    assert fp32["time_to_target_s"] == 20 and fp32["steps_to_target"] == 20 and fp32["speedup"] == 1
    assert onebit["time_to_target_s"] == 4 and onebit["steps_to_target"] == 10 and onebit["speedup"] == 5
    assert psgd["time_to_target_s"] is None and psgd["speedup"] is None
    text = table(rows)
    assert "| Horovod onebit | 4.0 | 5.00x | 1.900 |" in text and "| DDP powersgd1 | not reached | - | 2.500 |" in text
    assert first_at_or_below([{"loss": float("nan")}, {"loss": 1.0}], 2.0) == {"loss": 1.0}
    with pytest.raises(ValueError, match="no hvd:fp32 row at 100mbit"):
        add_targets([_row("hvd:onebit", [1.0], [0], rate="100mbit")])


def test_compact_table_has_a_column_per_optimizer_and_rate():
    """One line per row; each (optimizer, rate) a column of seconds to target and speed-up, or
    "not reached" with the final loss; a row missing at a rate shows "-"; the targets last."""
    rows = [_row("hvd:fp32", [4.0, 2.5, 2.0], [0, 10, 20]),
            _row("hvd:onebit", [4.0, 2.03, 1.9], [0, 4, 8]),
            _row("hvd:fp32", [4.0, 3.0, 3.0], [0, 30, 60], rate="100mbit", opt="adamw"),
            _row("hvd:onebit", [4.0, 3.5, 3.5], [0, 5, 10], rate="100mbit", opt="adamw")]
    add_targets(rows)
    lines = compact_table(rows).splitlines()
    assert lines[0] == "| row | sgd, 1gbit | adamw, 100mbit |"
    assert lines[2] == "| Horovod fp32 | 20 s (1.00x) | 30 s (1.00x) |"
    assert lines[3] == "| Horovod onebit | 4 s (5.00x) | not reached (3.50) |"
    assert lines[4] == "| *target loss* | *2.040* | *3.060* |"
    rows.append(_row("ddp:allreduce", [4.0, 2.0], [0, 12]))
    add_targets(rows)
    assert "| DDP allreduce | 12 s (1.67x) | - |" in compact_table(rows)


def test_replace_block_keeps_the_rest_of_the_page():
    page = f"# Title\n\ntext\n{README_BEGIN}\nold table\n{README_END}\nafter\n"
    assert replace_block(page, "new") == f"# Title\n\ntext\n{README_BEGIN}\nnew\n{README_END}\nafter\n"
    for bad in ("no markers\n", f"{README_END}\n{README_BEGIN}\n", f"{README_BEGIN}\nx\n"):
        with pytest.raises(ValueError, match="needs one line"):
            replace_block(bad, "new")


def test_readme_from_json(tmp_path, capsys):
    """--from-json --readme rewrites the page's block with the run's line and the table; a page
    without the markers is an error that names them, and the page is left as it was."""
    rows = [_row("hvd:fp32", [4.0, 2.5, 2.0], [0, 10, 20]), _row("hvd:onebit", [4.0, 2.03, 1.9], [0, 4, 8])]
    meta = {"np": 4, "net": "bridge", "size": "small", "params": 1_220_455, "steps": 20, "batch": 16,
            "eval_every": 10, "sgd_lr": 0.1, "momentum": 0.9, "adamw_lr": 3e-3, "weight_decay": 0.01,
            "machine": "commit abc1234, 2026-11-28, a CPU (2 cores), torch x, load average 3.00"}
    data = tmp_path / "tta.json"
    data.write_text(json.dumps({"meta": meta, "rows": rows}))
    page = tmp_path / "README.md"
    page.write_text(f"intro\n{README_BEGIN}\nold\n{README_END}\nend\n")
    assert main(["tta", "--from-json", str(data), "--readme", str(page)]) == 0
    text = page.read_text()
    assert text.startswith(f"intro\n{README_BEGIN}\ncommit abc1234, 2026-11-28") and text.endswith(f"{README_END}\nend\n")
    assert "| Horovod onebit | 4 s (5.00x) |" in text and "old" not in text
    page.write_text("no markers here\n")
    capsys.readouterr()
    assert main(["tta", "--from-json", str(data), "--readme", str(page)]) == 2
    assert "needs one line" in capsys.readouterr().err and page.read_text() == "no markers here\n"


def test_bad_options_name_the_problem(capsys):
    assert main(["tta", "--quick", "--rows", "hvd:fp32,hvd:bogus"]) == 2
    assert "unknown rows ['hvd:bogus']" in capsys.readouterr().err
    assert main(["tta", "--quick", "--optimizers", "lamb"]) == 2
    assert "--optimizers: unknown ['lamb']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tta", "--steps", "0"])
    assert "argument --steps: must be >= 1, got '0'" in capsys.readouterr().err


@pytest.mark.timeout(150)
def test_quick_runs_end_to_end(tmp_path, capsys):
    """--quick on the loopback harness at 1 Gbit/s, K=2: six rows train, every row has its
    curve, final loss and time to target; the JSON, plot and table are written and the
    report can be made again from the JSON."""
    try:
        slownet.check_available("loopback")
    except slownet.NamespacesNotPermitted as exc:
        pytest.skip(str(exc))
    out, prefix, md = tmp_path / "tta.json", str(tmp_path / "tta"), tmp_path / "tta.md"
    assert main(["tta", "--quick", "--timeout", "110", "--json", str(out), "--plot", prefix,
                 "--markdown", str(md)]) == 0
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert [r["row"] for r in rows] == ["hvd:fp32", "hvd:fp16", "hvd:onebit", "ddp:allreduce", "ddp:powersgd1",
                                        "ddp:onebit"]
    for r in rows:
        assert r["k"] == 2 and r["rate"] == "1gbit" and r["optimizer"] == "sgd"
        assert [p["step"] for p in r["points"]] == [0, 5, 10, 15, 20]
        assert all(math.isfinite(p["loss"]) for p in r["points"]) and r["final_loss"] == r["points"][-1]["loss"]
        assert r["final_loss"] < r["points"][0]["loss"]                  # it trained
        assert r["points"][-1]["seconds"] > r["points"][1]["seconds"] > 0
        assert "time_to_target_s" in r
    ref = rows[0]
    assert ref["time_to_target_s"] is not None and ref["time_to_target_s"] <= ref["seconds"] and ref["speedup"] == 1
    # the dense rows start from the same parameters and data: the same losses
    assert rows[3]["points"][1]["loss"] == pytest.approx(ref["points"][1]["loss"], rel=1e-4)
    assert (tmp_path / "tta_1gbit.png").stat().st_size > 10_000
    text = md.read_text()
    assert text.startswith("# Time to accuracy") and "commit " in text and "| Horovod fp32 |" in text
    capsys.readouterr()
    assert main(["tta", "--from-json", str(out)]) == 0
    assert "| DDP powersgd1 |" in capsys.readouterr().out
