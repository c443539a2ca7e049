"""The cost model's arithmetic (bench/cost_model.py) against hand-computed cases, and its command line."""
from __future__ import annotations

import json

import pytest

from horovod_gradcomp.bench import cost_model as cm
from horovod_gradcomp.bench.__main__ import main

N = 1_000_000


def _inputs():
    return cm.Inputs(N, 50.0, {"onebit": {"encode_ms": 10.0, "decode_ms": 4.0, "bytes": 125_000},
                               "terngrad": {"encode_ms": 12.0, "decode_ms": 5.0, "bytes": 250_000},
                               "qsgd4": {"encode_ms": 20.0, "decode_ms": 8.0, "bytes": 500_000},
                               "dgc": {"encode_ms": 30.0, "decode_ms": 0.5, "bytes": 8_000}},
                     {"encode_ms": 3.0, "decode_ms": 2.0}, {1: {"compute_ms": 40.0, "bytes": 20_000},
                                                            4: {"compute_ms": 90.0, "bytes": 80_000}})


def test_allgather_and_two_phase_terms():
    inp = _inputs()
    p = cm.predict("onebit/allgather", 8, 1e9, inp, alpha_s=1e-5, pipeline_bytes=None)
    assert p["bytes_per_rank"] == 7 * 125_000
    assert p["wire_ms"] == pytest.approx(1e3 * 8 * 7 * 125_000 / 1e9)
    assert p["cpu_ms"] == pytest.approx(50 + 10 + 8 * 4)
    assert p["latency_ms"] == pytest.approx(1e3 * (2 * 3 + 7) * 1e-5)     # placeholder + preamble, ring allgather
    q = cm.predict("onebit/two_phase", 8, 1e9, inp, alpha_s=1e-5, pipeline_bytes=None)
    assert q["bytes_per_rank"] == pytest.approx(2 * 7 / 8 * 125_000)
    assert q["cpu_ms"] == pytest.approx(50 + (1 + 1 / 8) * 10 + 8 * 4 / 8 + 4)
    inp.codecs["onebit"].update(dmean1_ms=5.0, dmean8_ms=12.0)       # measured decode-means: linear in K
    assert cm.predict("onebit/allgather", 15, 1e9, inp)["cpu_ms"] == pytest.approx(50 + 10 + 5 + 14 * 1.0)
    assert q["step_ms"] == pytest.approx(q["cpu_ms"] + q["wire_ms"] + q["latency_ms"])


def test_terngrad_two_phase_sends_exact_sums():
    """TernGrad's owners send 4-bit sums up to K=7 and 8-bit ones up to 127: (K-1)/K (1 + w/2)
    payloads per rank, and no requantizing encode."""
    inp = _inputs()
    for k, w in ((4, 4), (8, 8)):
        t = cm.predict("terngrad/two_phase", k, 1e9, inp, alpha_s=0, pipeline_bytes=None)
        assert t["bytes_per_rank"] == pytest.approx((k - 1) / k * 250_000 * (1 + w / 2))
        assert t["cpu_ms"] == pytest.approx(50 + 12 + k * 5 / k + 5)
    assert cm.predict("terngrad/two_phase", 4, 1e9, inp)["bytes_per_rank"] < \
        cm.predict("terngrad/allgather", 4, 1e9, inp)["bytes_per_rank"]


def test_pipelined_chunks_overlap_codec_and_wire():
    inp = _inputs()
    whole = cm.predict("qsgd4/allgather", 8, 1e9, inp, alpha_s=0, pipeline_bytes=None)
    assert whole["chunks"] == 1 and whole["step_ms"] == pytest.approx(whole["cpu_ms"] + whole["wire_ms"])
    piped = cm.predict("qsgd4/allgather", 8, 1e9, inp, alpha_s=0, pipeline_bytes=100_000)
    assert piped["chunks"] == 5                           # 500 kB of payload in chunks of 100 kB
    codec = 20 + 8 * 8                                    # encode + 8 single decodes (no decode-mean inputs)
    wire = 1e3 * 8 * 7 * 500_000 / 1e9                    # 28 ms: less than the codec's 84
    assert piped["step_ms"] == pytest.approx(50 + codec + wire - wire * (1 - 1 / 5))
    # dgc is variable-size: never chunked
    assert cm.predict("dgc/allgather", 8, 1e9, inp, pipeline_bytes=1)["chunks"] == 1


def test_dense_powersgd_and_harness_layout():
    inp = _inputs()
    fp32 = cm.predict("fp32", 4, 1e10, inp, alpha_s=0)
    assert fp32["bytes_per_rank"] == pytest.approx(1.5 * 4 * N) and fp32["cpu_ms"] == 50
    assert cm.predict("fp16", 4, 1e10, inp, alpha_s=0)["bytes_per_rank"] == pytest.approx(1.5 * 2 * N)
    ps = cm.predict("powersgd4", 4, 1e10, inp, alpha_s=0)
    assert ps["bytes_per_rank"] == pytest.approx(1.5 * 80_000) and ps["cpu_ms"] == 140
    loop = cm.predict("fp32", 4, 1e10, inp, alpha_s=0, layout="loopback", cores=2)
    assert loop["wire_ms"] == pytest.approx(4 * fp32["wire_ms"]) and loop["cpu_ms"] == pytest.approx(100)
    with pytest.raises(ValueError, match="allgather only"):
        cm.predict("dgc/two_phase", 4, 1e9, inp)


def test_powersgd_factor_bytes_follows_the_hook_rule():
    # rank 1: (64, 3, 7, 7) as 64 x 147: (64+147)*2 < 64*147 -> factors; (10, 3): 26 < 30 -> factors;
    # (4, 4): 16 is not < 16 -> whole; (5,) whole
    assert cm.powersgd_factor_bytes([(64, 3, 7, 7), (10, 3), (4, 4), (5,)], 1) == 4 * ((64 + 147) + 13 + 16 + 5)
    # rank 4 on a 4x4 matrix: (4+4)*4*2 >= 16, uncompressed
    assert cm.powersgd_factor_bytes([(4, 4)], 4) == 64


def test_command_line_table(tmp_path, capsys):
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(_inputs().to_json()))
    md = tmp_path / "model.md"
    assert main(["model", "--inputs", str(path), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "PREDICTED" in out and "K=256" in out and "100 Gbit/s" in out and "powersgd1" in out
    assert md.read_text().startswith("# Cost model: PREDICTED")
    assert main(["model"]) == 2
    # a check whose shapes differ from the inputs' model is refused before anything runs
    assert main(["model", "--inputs", str(path), "--check", "--shapes", "small"]) == 2


def test_in_situ_steps_and_contention():
    """With in-situ inputs the CPU term is the method's own step at -np 2 plus what K adds to
    the codec; the contention factor scales the other methods' CPU term on a shared machine."""
    inp = _inputs()
    inp.in_situ = {"onebit/allgather": 80.0, "onebit/two_phase": 120.0}
    inp.contention = {2: 1.5}
    assert cm.IN_SITU_NP == 2
    p = cm.predict("onebit/allgather", 8, 1e9, inp)
    assert p["cpu_ms"] == pytest.approx(80 + (10 + 8 * 4) - (10 + 2 * 4))        # + dmean(8) - dmean(2)
    q = cm.predict("onebit/two_phase", 4, 1e9, inp)
    assert q["cpu_ms"] == pytest.approx(120 + ((1 + 1 / 4) * 10 + 4 * 4 / 4 + 4) - ((1 + 1 / 2) * 10 + 2 * 4 / 2 + 4))
    assert cm.predict("terngrad/allgather", 8, 1e9, inp)["cpu_ms"] == pytest.approx(50 + 12 + 8 * 5)  # no in-situ figure
    shared = cm.predict("onebit/allgather", 4, 1e9, inp, layout="loopback", cores=2)
    assert shared["cpu_ms"] == pytest.approx(2 * (80 + 2 * 4))                     # no contention factor on top
    dense = cm.predict("fp32", 4, 1e9, inp, layout="loopback", cores=2)
    assert dense["cpu_ms"] == pytest.approx(2 * 1.5 * 50)
    assert inp.contention_at(1) == 1.0 and inp.contention_at(3) == 1.5
    again = cm.Inputs.from_json(json.loads(json.dumps(inp.to_json())))
    assert again.in_situ == inp.in_situ and again.contention == inp.contention


def test_in_situ_cpu_time_on_shared_cores():
    """With the in-situ step's CPU time, K ranks on fewer cores cost max(step, cpu * K / cores)
    plus the codec's extra CPU for K scaled by K / cores; without cores (one rank per machine)
    the CPU time is not used; old inputs without it load and predict as before."""
    inp = _inputs()
    inp.in_situ = {"onebit/allgather": 80.0}
    inp.in_situ_cpu = {"onebit/allgather": 60.0}
    extra = (10 + 4 * 4) - (10 + 2 * 4)                                            # dmean(4) - dmean(2)
    busy = cm.predict("onebit/allgather", 4, 1e9, inp, layout="loopback", cores=2)
    assert busy["cpu_ms"] == pytest.approx(max(80.0, 60.0 * 4 / 2) + 2 * extra)   # the CPU demand decides
    inp.in_situ_cpu = {"onebit/allgather": 30.0}
    idle = cm.predict("onebit/allgather", 4, 1e9, inp, layout="loopback", cores=2)
    assert idle["cpu_ms"] == pytest.approx(80.0 + 2 * extra)                       # the measured step decides
    alone = cm.predict("onebit/allgather", 4, 1e9, inp)
    assert alone["cpu_ms"] == pytest.approx(80.0 + extra)
    again = cm.Inputs.from_json(json.loads(json.dumps(inp.to_json())))
    assert again.in_situ_cpu == inp.in_situ_cpu
    old = inp.to_json()
    del old["in_situ_cpu"]
    assert cm.Inputs.from_json(old).in_situ_cpu == {}


# -- the cluster form: bench model --nodes N (bench/cost_cluster.py) ----------------------

from horovod_gradcomp.bench import cost_cluster as cc  # noqa: E402


def _cluster(numel, nodes, per_node, gbit, gbyte=150.0):
    rows = cc.cluster_rows(cc.scale_inputs(_inputs(), numel), nodes, per_node, gbit, gbyte, alpha_s=0.0)
    return {r["method"]: r for r in rows}, rows


def test_scaling_and_fp16_terms():
    """Codec times, payloads and casts scale with the model's size; the fp16 allreduce sends
    half of fp32's bytes, flat and hierarchical, and pays the casts."""
    big = cc.scale_inputs(_inputs(), 10 * N)
    assert big.numel == 10 * N and big.codecs["onebit"]["encode_ms"] == pytest.approx(100.0)
    assert big.codecs["dgc"]["bytes"] == pytest.approx(80_000) and big.fp16["decode_ms"] == pytest.approx(20.0)
    assert big.compute_ms == 0 and big.in_situ == {} and big.powersgd == {}
    by, rows = _cluster(N, 4, 8, 10.0)
    assert [r["exchange_ms"] for r in rows] == sorted(r["exchange_ms"] for r in rows)
    k = 32
    assert by["fp16/flat"]["inter_bytes"] == pytest.approx(2 * (k - 1) / k * 2 * N)
    assert by["fp16/flat"]["inter_bytes"] == pytest.approx(by["fp32/flat"]["inter_bytes"] / 2)
    assert by["fp16/flat"]["codec_ms"] == pytest.approx(3.0 + 2.0)
    h = by["fp16/hierarchical"]
    assert h["inter_bytes"] == pytest.approx(2 * 3 / 4 * 2 * N / 8)
    assert h["intra_ms"] == pytest.approx(1e3 * 2 * 7 / 8 * 2 * N / 150e9)
    assert h["exchange_ms"] == pytest.approx(h["codec_ms"] + h["intra_ms"] + h["inter_ms"])
    # one GPU per node: no hierarchical rows (they would be the flat ones)
    one, _ = _cluster(N, 4, 1, 10.0)
    assert not [m for m in one if "hierarchical" in m] and "onebit/two_phase" in one
    with pytest.raises(ValueError, match="at least one value"):
        cc.scale_inputs(_inputs(), 0)
    with pytest.raises(ValueError, match=">= 1"):
        cc.cluster_rows(_inputs(), 0, 8, 10.0, 150.0)


def test_recommendation_dense_on_a_fast_network_with_a_small_model():
    _, rows = _cluster(100_000, 2, 8, 400.0)
    method, reason = cc.recommend(rows)
    assert cc.is_dense(method) and reason.startswith("dense is fine here")


def test_recommendation_codec_on_a_slow_network_with_a_big_model():
    by, rows = _cluster(1_000 * N, 16, 8, 1.0)
    method, reason = cc.recommend(rows)
    assert not cc.is_dense(method), reason
    dense = min(r["exchange_ms"] for r in rows if cc.is_dense(r["method"]))
    assert by[method]["exchange_ms"] * cc.MIN_SPEEDUP <= dense
    assert f"{dense / by[method]['exchange_ms']:.1f}x faster" in reason


def test_recommendation_threshold():
    """A codec faster than dense, but by less than min_speedup, is not recommended."""
    rows = [{"method": "fp32/flat", "exchange_ms": 100.0, "codec_ms": 0.0, "inter_ms": 90.0},
            {"method": "onebit/two_phase", "exchange_ms": 90.0, "codec_ms": 20.0, "inter_ms": 60.0}]
    method, reason = cc.recommend(rows)
    assert method == "fp32/flat" and "only 1.11x faster" in reason and "dense is fine here" in reason
    assert cc.recommend(rows, min_speedup=1.1)[0] == "onebit/two_phase"
    with pytest.raises(ValueError, match="min_speedup"):
        cc.recommend(rows, min_speedup=0.5)


def _write_inputs(tmp_path):
    path = tmp_path / "inputs.json"
    path.write_text(json.dumps(_inputs().to_json()))
    return str(path)


def test_cluster_command_line(tmp_path, capsys):
    """The issue's command with the repository's inputs, and every model option."""
    assert main(["model", "--nodes", "16", "--gpus-per-node", "8", "--inter-node-gbit", "25", "--params", "1.3e9"]) == 0
    out = capsys.readouterr().out
    assert "16 nodes x 8 GPUs (K=128)" in out and "1,300,000,000 parameters" in out
    assert "| fp32/hierarchical |" in out or "| **fp32/hierarchical** |" in out
    assert "fp16/flat" in out and "onebit/hierarchical-two_phase" in out and "dgc/allgather" in out
    assert "\nRecommendation: " in out and "Reason: " in out
    inputs = _write_inputs(tmp_path)
    shapes = tmp_path / "shapes.json"
    shapes.write_text(json.dumps({"w": [1000, 1000], "b": [1000]}))
    md = tmp_path / "cluster.md"
    assert main(["model", "--inputs", inputs, "--nodes", "2", "--per-node", "4", "--inter-gbit", "100",
                 "--intra-node-gbyte", "50", "--shapes-file", str(shapes), "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "1,001,000 parameters in 2 tensors" in out and "50 GB/s inside a node" in out
    assert ("PowerSGD is not priced: the inputs' PowerSGD figures are for a model of 1,000,000 values, "
            "not the 25,557,032") in out
    assert md.read_text().startswith("# Cost model: PREDICTED exchange on one cluster")
    assert main(["model", "--inputs", inputs, "--nodes", "1", "--model", "resnet50"]) == 0
    assert "resnet50: 25,557,032 parameters in 161 tensors" in capsys.readouterr().out
    # a fast network and a small model: dense
    assert main(["model", "--inputs", inputs, "--nodes", "2", "--inter-node-gbit", "400", "--params", "1e5"]) == 0
    assert "dense is fine here" in capsys.readouterr().out
    # --nodes without a number: the N x L table over 2..64 nodes, as before
    assert main(["model", "--inputs", inputs, "--nodes"]) == 0
    assert "N=64 (K=512)" in capsys.readouterr().out


def test_cluster_command_calibrates_here(capsys):
    """--calibrate measures the codec inputs on this machine (one CPU core without a GPU)."""
    assert main(["model", "--nodes", "2", "--params", "1e7", "--calibrate", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert "calibrated " in out and "Recommendation: " in out


@pytest.mark.parametrize("argv, message", [
    (["--nodes", "0", "--params", "1e9"], "argument --nodes: must be a whole number >= 1, got '0'"),
    (["--nodes", "two", "--params", "1e9"], "argument --nodes: expected a number, got 'two'"),
    (["--nodes", "2", "--gpus-per-node", "2.5", "--params", "1e9"], "argument --gpus-per-node/--per-node: must be"),
    (["--nodes", "2", "--inter-node-gbit", "-1", "--params", "1e9"],
     "argument --inter-node-gbit/--inter-gbit: must be > 0"),
    (["--nodes", "2", "--intra-node-gbyte", "nan", "--params", "1e9"], "expected a finite number, got 'nan'"),
    (["--nodes", "2", "--params", "-5"], "argument --params: must be >= 1, got '-5'"),
    (["--nodes", "2", "--model", "vgg"], "argument --model: invalid choice: 'vgg'"),
    (["--nodes", "2", "--shapes-file", "/nonexistent.json"], "argument --shapes-file: cannot read"),
    (["--nodes", "2", "--params", "1e9", "--model", "resnet50"], "not allowed with argument"),
])
def test_cluster_bad_values_name_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["model"] + argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("usage:")


def test_cluster_needs_a_model_and_the_model_needs_nodes(tmp_path, capsys):
    assert main(["model", "--nodes", "2"]) == 2
    assert "needs the model: --params N, --shapes-file JSON or --model NAME" in capsys.readouterr().err
    assert main(["model", "--params", "1e9"]) == 2
    assert "give --nodes N" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([[3, 0]]))
    with pytest.raises(SystemExit):
        main(["model", "--nodes", "2", "--shapes-file", str(bad)])
    assert "a shape must be a list of whole numbers >= 1, got [3, 0]" in capsys.readouterr().err


def test_scaling_check_rows(capsys):
    """--check-scaling compares the scaled inputs of the first tensors with the whole measured."""
    from horovod_gradcomp.bench.cost_scaling_check import TERMS, check_scaling, format_scaling
    whole, rows = check_scaling((20,), repeat=1)
    assert whole.numel == 25_557_032
    assert {(r["method"], r["term"]) for r in rows} == \
        {(k, t) for k in cm.CODECS for t in TERMS} | {("fp16", "encode_ms"), ("fp16", "decode_ms")}
    for r in rows:
        assert r["scaled"] > 0 and r["measured"] > 0
        assert r["rel_error"] == pytest.approx((r["scaled"] - r["measured"]) / r["measured"])
    assert "| 20 (" in format_scaling(rows, whole.numel)


def test_powersgd_in_the_cluster_form(tmp_path, capsys):
    """PowerSGD's time is a W(r) + b r W(r), a and b solved from the rank-1 and rank-4 figures;
    its exchange the ring allreduce of its factor bytes; priced only when the shapes are known."""
    from horovod_gradcomp.bench import cost_powersgd as cp
    shapes = [(1000, 1000), (200, 50), (4, 4), (1000,)]
    # rank 1: (1000, 1000) and (200, 50) compress; rank 4: both still compress ((200+50)*4*2 < 10000)
    assert cp.matrix_values(shapes, 1) == 1_010_000 and cp.matrix_values(shapes, 4) == 1_010_000
    assert cp.matrix_values([(200, 50)], 40) == 0             # (250 * 40 * 2 >= 10000): whole
    inp = _inputs()
    inp.numel = sum(a * b for a, b in [(1000, 1000), (200, 50)]) + 16 + 1000
    a, b = 2e-5, 1e-5
    w = 1_010_000
    inp.powersgd = {1: {"compute_ms": a * w + b * w, "bytes": 0}, 4: {"compute_ms": a * w + 4 * b * w, "bytes": 0}}
    assert cp.coefficients(inp, shapes) == pytest.approx((a, b))
    with pytest.raises(ValueError, match="of the shapes they are taken as measured on"):
        cp.coefficients(inp, shapes[:1])
    p = cp.predict_powersgd(4, shapes, 2, 4, (a, b), inter_bits_per_s=1e9, alpha_s=1e-5)
    assert p["inter_bytes"] == pytest.approx(2 * 7 / 8 * cm.powersgd_factor_bytes(shapes, 4))
    assert p["codec_ms"] == pytest.approx(a * w + 4 * b * w) and p["latency_ms"] == pytest.approx(1e3 * 6 * 7 * 1e-5)
    assert main(["model", "--nodes", "2", "--model", "resnet50"]) == 0
    out = capsys.readouterr().out
    assert "powersgd1/flat" in out and "powersgd4/flat" in out
    assert main(["model", "--nodes", "2", "--params", "1e8"]) == 0
    out = capsys.readouterr().out
    assert "powersgd1/flat" not in out and "PowerSGD is not priced: it needs the model's shapes" in out


# -- FSDP2's reduce-scatter rows (bench/cost_fsdp.py) ------------------------------------------

from horovod_gradcomp.bench import cost_fsdp as cf  # noqa: E402
from horovod_gradcomp.bench import cost_nodes as cn  # noqa: E402


def _fsdp(nodes, per_node, gbit=10.0, gbyte=150.0, alpha_s=0.0):
    rows = cf.fsdp_rows(_inputs(), nodes, per_node, gbit, gbyte, alpha_s=alpha_s)
    return {r["method"]: r for r in rows}, rows


def test_fsdp2_sharded_and_hsdp_bytes_at_8_gpus_per_node(capsys):
    """Bytes per GPU and step at 4 nodes x 8 GPUs: FSDP2's own reduce-scatter sends (K-1)/K of the
    gradient (fp32: 4 n, bf16: 2 n); the compressed one (K-1)/K of one payload of the model (each GPU
    encodes it once); HSDP a reduce-scatter inside the node ((L-1)/L of 4 n, half the node model's
    allreduce there) and the codec on the 1/L shard between nodes, as the node model's hierarchical rows."""
    by, rows = _fsdp(4, 8)
    k, n = 32, N
    assert [r["exchange_ms"] for r in rows] == sorted(r["exchange_ms"] for r in rows)
    assert by["fsdp2-fp32/sharded"]["inter_bytes"] == pytest.approx((k - 1) / k * 4 * n)
    assert by["fsdp2-bf16/sharded"]["inter_bytes"] == pytest.approx((k - 1) / k * 2 * n)
    assert by["fsdp2-bf16/sharded"]["codec_ms"] == pytest.approx(3.0 + 2.0)   # the casts
    one = by["onebit/fsdp2-sharded"]
    assert one["inter_bytes"] == pytest.approx((k - 1) / k * 125_000) and one["intra_bytes"] == 0
    assert one["codec_ms"] == pytest.approx(10.0 + k * 4.0 / k)   # one encode, K decodes of 1/K
    assert one["inter_ms"] == pytest.approx(1e3 * 8 * one["inter_bytes"] / 10e9)
    dense_hsdp = by["fsdp2-fp32/hsdp"]
    assert dense_hsdp["intra_bytes"] == pytest.approx(7 / 8 * 4 * n)
    assert dense_hsdp["inter_bytes"] == pytest.approx(2 * 3 / 4 * 4 * n / 8)
    for label, base in (("onebit/fsdp2-hsdp-two_phase", "onebit/hierarchical-two_phase"),
                        ("dgc/fsdp2-hsdp-allgather", "dgc/hierarchical-allgather")):
        node = cn.predict_nodes(base, 4, 8, _inputs(), inter_bits_per_s=10e9, intra_bytes_per_s=150e9, alpha_s=0.0)
        assert by[label]["inter_bytes"] == pytest.approx(node["inter_bytes"])
        assert by[label]["intra_bytes"] == pytest.approx(node["intra_bytes"] / 2)
        assert by[label]["codec_ms"] == pytest.approx(node["codec_ms"])
    assert "dgc/fsdp2-hsdp-two_phase" not in by   # variable-size: allgather only
    # latency: the compressed alltoallv's K-1 messages, the preamble's and (DGC) the sizes' K-1
    lat, _ = _fsdp(4, 8, alpha_s=1e-6)
    assert lat["onebit/fsdp2-sharded"]["latency_ms"] == pytest.approx(1e-3 * (31 + 5))
    assert lat["dgc/fsdp2-sharded"]["latency_ms"] == pytest.approx(1e-3 * (31 + 5 + 31))
    assert lat["fsdp2-fp32/hsdp"]["latency_ms"] == pytest.approx(
        cn.predict_nodes("fp32/hierarchical", 4, 8, _inputs(), inter_bits_per_s=10e9, intra_bytes_per_s=150e9,
                         alpha_s=1e-6)["latency_ms"] - 1e-3 * 7)
    # one node, or one GPU per node: no HSDP rows
    assert not [m for m in _fsdp(1, 8)[0] if "hsdp" in m] and not [m for m in _fsdp(4, 1)[0] if "hsdp" in m]
    with pytest.raises(ValueError, match="unknown FSDP2 method"):
        cf.predict_fsdp("onebit/fsdp2-hsdp-allgather", 1, 8, _inputs(), inter_bits_per_s=1e9, intra_bytes_per_s=1e9)
    # the command line prints them after the DDP/Horovod table
    assert main(["model", "--nodes", "16", "--gpus-per-node", "8", "--params", "1.3e9"]) == 0
    out = capsys.readouterr().out
    assert "FSDP2's gradient reduce-scatter (PREDICTED" in out
    assert "fsdp2-fp32/sharded |" in out and "onebit/fsdp2-sharded |" in out and "onebit/fsdp2-hsdp-two_phase |" in out
