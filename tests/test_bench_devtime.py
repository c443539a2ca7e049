"""Tests of the ``devtime`` benchmark on the twin (single process, CPU): one row per bucket op of
each codec, its counts equal to the ones ``bench codecs`` reports for the same bucket pass."""
from __future__ import annotations

import json

import pytest

import horovod_gradcomp as hgc
from horovod_gradcomp.bench import codecs_bench, devtime_bench
from horovod_gradcomp.bench.__main__ import main
from horovod_gradcomp.bench.shapes import resnet50_shapes

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not hgc.twin_available(), reason="needs the twin (ci/build_twin.sh)")]


def test_rows_per_bucket_op_with_the_twins_counts(capsys):
    assert main(["devtime", "--device", "twin", "--json", "--repeat", "1", "--limit-tensors", "3",
                 "--codecs", "onebit,qsgd,dgc"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert "copy of the bucket's" in err
    grads = codecs_bench.make_gradients(resnet50_shapes()[:3])
    nbytes = sum(g.numel() * 4 for g in grads)
    for name in ("onebit", "qsgd", "dgc"):
        mine = [r for r in rows if r["codec"] == name]
        expected = codecs_bench.bucket_op_counts(hgc.get_codec(name, impl="twin"), grads)
        assert [[r["op"], r["calls"], r["syncs"]] for r in mine] == expected
        for r in mine:
            assert set(devtime_bench.ROW_KEYS) <= set(r) and r["device"] == "twin" and r["bytes"] == nbytes
            assert r["op_ms"] > 0 and r["copy_ms"] > 0
            assert r["ratio"] == pytest.approx(r["op_ms"] / r["copy_ms"], rel=0.02, abs=0.01)
    assert {r["op"] for r in rows} >= {"onebit_encode_many", "qsgd_encode_fixed_many", "dgc_select_many"}


def test_table_lists_each_op_and_the_module_is_restored(capsys):
    twin = hgc.native.require_twin()
    before = twin.onebit_encode_many
    assert main(["devtime", "--repeat", "1", "--limit-tensors", "2", "--codecs", "onebit"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["codec", "op", "op_ms", "copy_ms", "op/copy", "calls", "syncs"]
    assert "onebit_encode_many" in out and "onebit_decode_sum_many" in out
    assert twin.onebit_encode_many is before


def test_bad_input_is_an_error(capsys):
    assert main(["devtime", "--codecs", "nope", "--limit-tensors", "1"]) == 2
    assert "unknown codec 'nope'" in capsys.readouterr().err
    assert main(["devtime", "--codecs", "fp16", "--limit-tensors", "1"]) == 2
    assert "fp16 has no device ops" in capsys.readouterr().err


def test_default_run_times_every_codec_and_qsgds_elias_coding(capsys):
    assert main(["devtime", "--json", "--repeat", "1", "--limit-tensors", "2"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["codec"] for r in rows} == set(hgc.available_codecs()) - {"fp16"}
    elias = [r for r in rows if r.get("options") == {"coding": "elias"}]
    assert [r["op"] for r in elias] == ["qsgd_encode_elias_many", "qsgd_decode_elias_many"]
    assert main(["devtime", "--repeat", "1", "--limit-tensors", "1", "--codecs", "qsgd:coding=elias"]) == 0
    assert "qsgd coding=elias  qsgd_decode_elias_many" in capsys.readouterr().out
