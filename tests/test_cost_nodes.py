"""The node cost model (bench/cost_nodes.py) against hand-computed cases."""
from __future__ import annotations

import pytest

from horovod_gradcomp.bench import cost_model as cm
from horovod_gradcomp.bench import cost_nodes as cn
from test_cost_model import N, _inputs as cost_model_inputs


def _inputs():
    inputs = cost_model_inputs()
    inputs.in_situ = {"onebit/allgather": 500.0}   # ignored: the node model prices codecs alone
    return inputs


def _p(method, nodes, per_node, alpha=0.0):
    return cn.predict_nodes(method, nodes, per_node, _inputs(), inter_bits_per_s=1e9, intra_bytes_per_s=1e10,
                            alpha_s=alpha)


def test_hierarchical_allgather_terms():
    p = _p("onebit/hierarchical-allgather", 4, 8, alpha=1e-5)
    assert p["inter_bytes"] == pytest.approx(3 * 125_000 / 8)          # (N-1) S / L per NIC
    assert p["intra_bytes"] == pytest.approx(2 * 7 / 8 * 4 * N)         # dense scatter + gather
    assert p["codec_ms"] == pytest.approx((10 + 4 * 4) / 8)             # encode + 4 decodes, over L
    assert p["inter_ms"] == pytest.approx(1e3 * 8 * 3 * 125_000 / 8 / 1e9)
    assert p["intra_ms"] == pytest.approx(1e3 * 2 * 7 / 8 * 4 * N / 1e10)
    assert p["latency_ms"] == pytest.approx(1e3 * (2 * 5 + 14 + 3) * 1e-5)


def test_inter_node_bytes_per_node_are_one_lth_of_flat_allgather_or_less():
    for nodes, per_node in [(2, 2), (4, 8), (64, 8)]:
        flat = _p("onebit/allgather", nodes, per_node)["inter_bytes"] * per_node      # a node's L NICs
        hier = _p("onebit/hierarchical-allgather", nodes, per_node)["inter_bytes"] * per_node
        assert hier <= flat / per_node


def test_flat_rows_are_the_single_node_model_without_compute():
    p = _p("onebit/allgather", 2, 4)
    q = cm.predict("onebit/allgather", 8, 1e9, cm.Inputs(N, 50.0, _inputs().codecs, _inputs().fp16, {}),
                   alpha_s=0.0, pipeline_bytes=None)
    assert p["codec_ms"] == pytest.approx(q["cpu_ms"] - 50.0) and p["inter_bytes"] == q["bytes_per_rank"]


def test_dense_baselines_and_one_gpu_per_node():
    flat, hier = _p("fp32/flat", 4, 8), _p("fp32/hierarchical", 4, 8)
    assert flat["inter_bytes"] == pytest.approx(2 * 31 / 32 * 4 * N)
    assert hier["inter_bytes"] == pytest.approx(2 * 3 / 4 * 4 * N / 8)
    one = _p("terngrad/hierarchical-two_phase", 4, 1)
    assert one["intra_bytes"] == 0 and one["intra_ms"] == 0


def test_table_lists_every_method():
    text = cn.nodes_table(_inputs(), nodes=(2, 4), per_node=8)
    assert all(f"| {m} |" in text for m in cn.methods()) and "N=4 (K=32)" in text
    with pytest.raises(ValueError):
        _p("onebit/hierarchical-allgather", 0, 8)
