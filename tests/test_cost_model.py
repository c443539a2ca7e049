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
