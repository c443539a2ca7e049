"""Tests of the ``codecs`` benchmark (single process, CPU, a few seconds)."""
from __future__ import annotations

import json
import math

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.bench import codecs_bench
from horovod_gradcomp.bench.__main__ import main
from horovod_gradcomp.bench.shapes import RESNET50_NUMEL, RESNET50_TENSORS, resnet50_shapes, total_numel
from horovod_gradcomp.codecs import Codec, Payload, registry

pytestmark = pytest.mark.timeout(60)


def _run_json(capsys, *argv):
    """Run the bench main with --json; return (rows, stderr)."""
    assert main(["codecs", "--json", *argv]) == 0
    out, err = capsys.readouterr()
    return json.loads(out), err


# -- shapes --------------------------------------------------------------------------

def test_resnet50_shapes_match_torchvision_totals():
    shapes = resnet50_shapes()
    assert len(shapes) == RESNET50_TENSORS == 161
    assert total_numel(shapes) == RESNET50_NUMEL == 25_557_032
    assert shapes[0] == (64, 3, 7, 7) and shapes[-2:] == [(1000, 2048), (1000,)]
    # 53 convs + fc weight are the only tensors with more than one dimension.
    assert sum(len(s) == 4 for s in shapes) == 53


# -- ratios from the layout alone -------------------------------------------------------

@pytest.mark.parametrize("scales", ["rows", "columns"])
def test_onebit_ratio_on_resnet50_from_layout(scales):
    codec = hgc.get_codec("onebit", impl="reference", scales=scales)
    shapes = resnet50_shapes()
    ratio = codecs_bench.layout_ratio(codec, shapes)
    bits = sum((math.prod(s) + 7) // 8 for s in shapes)
    scales_bytes = sum(codec.payload_nbytes(s, torch.float32) for s in shapes) - bits
    assert bits == 3_194_629
    assert ratio == pytest.approx(4 * 25_557_032 / (bits + scales_bytes))
    if scales == "rows":  # two float32 values per row of the [shape[0], -1] view (per output channel): 29.9x
        assert scales_bytes == 8 * sum(s[0] if len(s) >= 2 else 1 for s in shapes) == 221_336
        assert ratio > 29.9, f"onebit compresses ResNet-50 gradients only {ratio:.2f}x"
    else:  # per column (Seide et al.): 440,304 bytes on top of the bits, 28.1x, not 32x
        assert scales_bytes == 8 * sum(1 if len(s) <= 1 else math.prod(s[1:]) for s in shapes) == 440_304
        assert ratio > 28.1, f"onebit compresses ResNet-50 gradients only {ratio:.2f}x"


def test_layout_matches_real_payload_bytes():
    codec = hgc.get_codec("onebit", impl="reference")
    shapes = resnet50_shapes()[:6]
    grads = codecs_bench.make_gradients(shapes)
    real = sum(codec.encode(g, residual=torch.zeros_like(g)).nbytes for g in grads)
    assert real == sum(codec.payload_nbytes(s, torch.float32) for s in shapes)
    assert math.isclose(codecs_bench.layout_ratio(codec, shapes), 4 * total_numel(shapes) / real)


# -- the command ---------------------------------------------------------------------

def test_json_rows_cover_every_codec_and_impl(capsys):
    rows, err = _run_json(capsys, "--repeat", "1", "--limit-tensors", "4", "--no-selection")
    impls = ["native", "twin", "reference"] if hgc.native_available() else ["reference"]
    assert hgc.twin_available(), "the twin of the device kernels did not build: its rows would be missing"
    expected = {("fp16", "torch")} | {(c, i) for c in hgc.available_codecs() for i in impls}
    if "twin" in impls:  # every codec's device kernels have bucket ops (csrc/device/multi_tensor.cuh)
        expected |= {(c, "twin-bucket") for c in hgc.available_codecs()}
    assert {(r["codec"], r["impl"]) for r in rows} == expected
    calls = {(r["codec"], r["impl"]): r.get("device_calls") for r in rows if r["impl"].startswith("twin")}
    assert all(c is not None and len(c) == 2 for c in calls.values()), calls
    # ResNet-50's first 4 tensors (a convolution, batch-norm vectors): the 4 stages of a bucket in rows
    # mode (onebit's default; columns mode adds its column finish), one decode
    assert calls[("onebit", "twin-bucket")] == [4, 1], calls
    assert calls[("onebit", "twin")][0] > 5, calls
    syncs = {(r["codec"], r["impl"]): r.get("host_syncs") for r in rows if r["impl"].startswith("twin")}
    assert all(c is not None and len(c) == 2 for c in syncs.values()), syncs
    assert syncs[("onebit", "twin-bucket")] == [0, 0] and syncs[("terngrad", "twin-bucket")] == [0, 0], syncs
    # every codec's bucket pass, op by op: each a bucket op, at most one host synchronization each
    ops = {r["codec"]: r.get("bucket_ops") for r in rows if r["impl"] == "twin-bucket"}
    assert set(ops) == set(hgc.available_codecs()) and all(ops.values()), ops
    for codec, called in ops.items():
        assert all(op.endswith("_many") and calls >= 1 and syncs <= 1 for op, calls, syncs in called), (codec, called)
        assert sum(s for _, _, s in called) == sum(syncs[(codec, "twin-bucket")]), (codec, called)
    numel = total_numel(resnet50_shapes()[:4])
    for r in rows:
        assert set(codecs_bench.REQUIRED_KEYS) <= set(r) and "options" not in r
        assert r["numel"] == numel
        assert r["encode_ms"] > 0 and r["decode_ms"] > 0 and r["bytes"] > 0
        assert math.isclose(r["ratio"], 4 * numel / r["bytes"], rel_tol=1e-3)
    fp16 = next(r for r in rows if r["codec"] == "fp16")
    assert fp16["bytes"] == 2 * numel and fp16["ratio"] == 2.0
    if not hgc.native_available():
        assert "MISSING" in err


def test_dgc_selection_rows_time_one_flat_tensor(capsys):
    rows, _ = _run_json(capsys, "--repeat", "1", "--limit-tensors", "1", "--codecs", "dgc",
                        "--selection-numel", "200000")
    sel = [r for r in rows if r["codec"] == codecs_bench.SELECTION]
    impls = ["native", "twin", "reference"] if hgc.native_available() else ["reference"]
    assert [r["impl"] for r in sel] == impls
    for r in sel:
        assert r["numel"] == 200000 and r["options"] == {"density": 0.001} and r["encode_ms"] > 0
        # exact top-k keeps 200 values; the sampled threshold keeps within [k/2, 2k]
        pairs = r["bytes"] // 8
        assert (pairs == 200) if r["impl"] == "reference" else (100 <= pairs <= 400)


def test_table_output_and_speedup_line(capsys):
    assert main(["codecs", "--repeat", "1", "--limit-tensors", "3", "--codecs", "fp16,onebit"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    assert header == ["codec", "impl", "options", "numel", "encode_ms", "decode_ms", "bytes", "ratio"]
    if hgc.native_available():
        assert "onebit: native vs reference speed-up: " in out and "x (encode+decode)" in out


def test_missing_native_is_reported_loudly(capsys, monkeypatch):
    monkeypatch.setattr(codecs_bench, "native_available", lambda: False)
    monkeypatch.setattr(codecs_bench, "twin_available", lambda: False)
    rows, err = _run_json(capsys, "--repeat", "1", "--limit-tensors", "2", "--codecs", "onebit")
    assert [(r["codec"], r["impl"]) for r in rows] == [("onebit", "reference")]
    assert "native" in err and "MISSING" in err and "'twin' rows are MISSING" in err


def test_twin_rows_sit_next_to_the_native_ones(capsys):
    assert main(["codecs", "--repeat", "1", "--limit-tensors", "3", "--codecs", "onebit",
                 "--impls", "native,twin"]) == 0
    out = capsys.readouterr().out
    assert "onebit: twin (device kernels on OpenMP) / native CPU kernels: " in out


class _HalfWithScale(Codec):
    """Test codec: fp16 times a ``scale`` option (fuses no feedback)."""

    def __init__(self, impl="native", scale=1.0):
        super().__init__(impl)
        self.scale = scale

    def encode(self, tensor, residual=None):
        return Payload({"h": (tensor * self.scale).half()}, tensor.shape, tensor.dtype)

    def decode(self, payload, out=None):
        result = payload.buffers["h"].to(payload.dtype) / self.scale
        return result if out is None else out.copy_(result)


def test_new_codecs_are_picked_up_from_the_registry_with_options(capsys, monkeypatch):
    monkeypatch.setitem(registry._REGISTRY, "bench_dummy", _HalfWithScale)
    assert "bench_dummy" in [name for name, _ in codecs_bench.default_specs()]
    rows, _ = _run_json(capsys, "--repeat", "1", "--limit-tensors", "2", "--impls", "reference",
                        "--codecs", "bench_dummy:scale=2.5")
    assert len(rows) == 1 and rows[0]["options"] == {"scale": 2.5} and rows[0]["ratio"] == 2.0


def test_bad_codec_name_is_an_error(capsys):
    assert main(["codecs", "--json", "--codecs", "nope"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "unknown codec 'nope'" in err


def test_parse_codec_spec():
    assert codecs_bench.parse_codec_spec("qsgd:bits=4:stochastic=True:mode=x") == (
        "qsgd", {"bits": 4, "stochastic": True, "mode": "x"})
    assert codecs_bench.parse_codec_spec("onebit") == ("onebit", {})
    with pytest.raises(ValueError):
        codecs_bench.parse_codec_spec("qsgd:bits")
