"""The node model's harness pricing (bench/cost_nodes_check.py) against hand-computed cases."""
from __future__ import annotations

import argparse

import pytest

from horovod_gradcomp.bench import cost_nodes as cn
from horovod_gradcomp.bench import cost_nodes_check as cc
from test_cost_model import N
from test_cost_nodes import _inputs


def _h(method, nodes, per_node, cores=2.0):
    return cc.predict_harness(method, nodes, per_node, _inputs(), rate_bits_per_s=1e9, intra_bytes_per_s=1e9,
                              cores=cores, alpha_s=0.0)


def _model(method, nodes, per_node):
    return cn.predict_nodes(method, nodes, per_node, _inputs(), inter_bits_per_s=1e9, intra_bytes_per_s=1e9,
                            alpha_s=0.0)


def test_hierarchical_ranks_share_their_node_link():
    h, m = _h("onebit/hierarchical-allgather", 2, 2), _model("onebit/hierarchical-allgather", 2, 2)
    assert h["link_bytes"] == pytest.approx(2 * m["inter_bytes"])        # L ranks' shards on one link
    assert h["intra_ms"] == pytest.approx(1e3 * m["intra_bytes"] / 1e9)  # the dense node steps
    assert h["codec_ms"] == pytest.approx(m["codec_ms"] * 2)              # 4 ranks on 2 cores


def test_flat_patterns_cross_only_to_other_nodes():
    h, m = _h("onebit/allgather", 2, 2), _model("onebit/allgather", 2, 2)
    # each rank's bytes go to 3 peers, 2 of them on the other node; both ranks use the one link
    assert h["link_bytes"] == pytest.approx(2 * m["inter_bytes"] * 2 / 3)
    assert h["intra_ms"] == pytest.approx(1e3 * m["inter_bytes"] / 3 / 1e9)


def test_fp32_ring_and_one_node():
    ring = _h("fp32/flat", 2, 2)
    assert ring["link_bytes"] == pytest.approx(2 * 3 / 4 * 4 * N)        # one crossing edge per node
    one = _h("onebit/two_phase", 1, 2)
    assert one["link_bytes"] == 0 and one["link_ms"] == 0 and one["intra_ms"] > 0
    single = _h("onebit/hierarchical-allgather", 2, 1)
    assert single["intra_ms"] == 0                                       # no node steps with L = 1


def test_compare_uses_the_runs_compute_and_skips_other_rows():
    rows = [{"config": "none", "ms_per_step": 1000.0, "rate_bits_per_s": 1e9, "rate": "1gbit"},
            {"config": "local", "ms_per_step": 50.0, "rate_bits_per_s": 1e9, "rate": "1gbit"},
            {"config": "onebit:pattern=two_phase", "skipped": "x", "rate_bits_per_s": 1e9, "rate": "1gbit"}]
    out = cc.compare_nodes(rows, 50.0, 2, 2, _inputs(), 1e9, 2.0, 0.0)
    assert [c["method"] for c in out] == ["fp32/flat"] and out[0]["measured_ms"] == 950.0
    p = _h("fp32/flat", 2, 2)["exchange_ms"]
    assert out[0]["rel_error"] == pytest.approx((p - 950.0) / 950.0, abs=1e-3)
    assert "| 2x2 | fp32/flat |" in cc.format_nodes_check(out)


def test_parse_layouts():
    assert cc.parse_layouts("2x1, 1x2,2X2") == [(2, 1), (1, 2), (2, 2)]
    for bad in ("2", "0x2", "axb"):
        with pytest.raises(argparse.ArgumentTypeError, match="layout"):
            cc.parse_layouts(bad)


def test_framework_work_comes_from_the_flat_in_situ_step():
    inputs = _inputs()          # in_situ: onebit/allgather 500 ms at -np 2
    isolated = cn.predict_nodes("onebit/allgather", 2, 1, inputs, inter_bits_per_s=1e18, intra_bytes_per_s=1e18,
                                alpha_s=0.0)["codec_ms"]
    want = 500.0 - inputs.compute_ms - isolated
    assert cc.framework_ms("onebit/allgather", inputs) == pytest.approx(want)
    assert cc.framework_ms("onebit/hierarchical-allgather", inputs) == pytest.approx(want)   # its inner's
    assert cc.framework_ms("fp32/flat", inputs) == 0.0 and cc.framework_ms("dgc/allgather", inputs) == 0.0
    h = _h("onebit/hierarchical-allgather", 2, 2)
    assert h["framework_ms"] == pytest.approx(2 * want)                  # 4 ranks on 2 cores


def test_node_copies_only_for_hierarchical_nodes_of_several_ranks():
    kw = dict(rate_bits_per_s=1e9, intra_bytes_per_s=1e9, cores=4.0, alpha_s=0.0, copy_bytes_per_s=2e9)
    hier = cc.predict_harness("dgc/hierarchical-allgather", 2, 2, _inputs(), **kw)
    assert hier["copy_ms"] == pytest.approx(1e3 * cc.NODE_COPY_PASSES * 4 * N / 2e9)
    assert cc.predict_harness("dgc/hierarchical-allgather", 2, 1, _inputs(), **kw)["copy_ms"] == 0.0
    assert cc.predict_harness("dgc/allgather", 2, 2, _inputs(), **kw)["copy_ms"] == 0.0
