"""Stripes of the two-phase exchange (horovod_gradcomp.exchange.stripes) and the byte plan of
horovod_gradcomp.exchange.two_phase, single process (the exchange itself: tests/mpi/mpi_two_phase.py)."""
from __future__ import annotations

import math

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.stripes import (balanced_ranges, column_stripes, matrix_shape, row_stripes, stripe_key,
                                      stripes)
from horovod_gradcomp.exchange.stream_positions import stream_position
from horovod_gradcomp.exchange.two_phase import StripePlan, TwoPhasePattern, choose_axis

KS = [1, 2, 3, 4, 8]
SHAPES = [(), (0,), (1,), (7,), (3, 5), (64, 3, 3, 3), (2, 9), (0, 4), (3, 0)]


def _id(shape):
    return "x".join(map(str, shape)) if shape else "scalar"


# -- ranges ------------------------------------------------------------------------------

@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_row_stripes_are_contiguous_balanced_and_cover_the_rows(shape, k):
    rows = matrix_shape(shape)[0]
    ranges = row_stripes(shape, k)
    assert len(ranges) == k
    assert ranges[0][0] == 0 and ranges[-1][1] == rows
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), "not contiguous"
    sizes = [b - a for a, b in ranges]
    assert max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True), "larger stripes go to the first owners"
    assert all(a == b == rows for a, b in ranges[rows:]), "owners past the row count get empty stripes"


def test_exact_rule():
    assert balanced_ranges(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert balanced_ranges(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    assert balanced_ranges(0, 2) == [(0, 0), (0, 0)]
    assert row_stripes((64, 3, 3, 3), 8) == [(8 * s, 8 * s + 8) for s in range(8)]
    assert row_stripes((), 2) == [(0, 1), (1, 1)]
    assert column_stripes((3, 5), 2) == [(0, 3), (3, 5)]
    assert column_stripes((7,), 2) == [(0, 1), (1, 1)]
    with pytest.raises(ValueError):
        balanced_ranges(3, 0)


@pytest.mark.parametrize("shape,expected", [((), (1, 1)), ((0,), (0, 1)), ((7,), (7, 1)), ((3, 5), (3, 5)),
                                            ((64, 3, 3, 3), (64, 27)), ((3, 0), (3, 0))])
def test_matrix_shape(shape, expected):
    assert matrix_shape(shape) == expected


# -- taking and putting ------------------------------------------------------------------

@pytest.mark.parametrize("axis", ["rows", "columns"])
@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("shape", SHAPES, ids=_id)
def test_stripes_partition_the_tensor(shape, k, axis):
    t = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
    parts = stripes(shape, k, axis)
    assert [st.owner for st in parts] == list(range(k))
    rows, cols = matrix_shape(shape)
    seen = torch.zeros(t.numel(), dtype=torch.int64)
    rebuilt = torch.full_like(t, -1.0)
    for st in parts:
        piece = st.take(t)
        assert piece.is_contiguous() and tuple(piece.shape) == st.shape and piece.numel() == st.numel
        width = st.stop - st.start
        if len(shape) <= 1:
            assert st.shape == ((width,) if axis == "rows" else (rows * width,))
        else:
            assert st.shape == ((width, cols) if axis == "rows" else (rows, width))
        m = t.reshape(rows, cols)
        expect = m[st.start:st.stop] if axis == "rows" else m[:, st.start:st.stop]
        assert torch.equal(piece, expect.reshape(st.shape))
        seen[piece.reshape(-1).long()] += 1
        st.put(rebuilt, piece)
    assert torch.equal(seen, torch.ones_like(seen)), "every element in exactly one stripe"
    assert torch.equal(rebuilt, t)


def test_row_stripe_of_a_contiguous_tensor_is_a_view_and_a_column_stripe_a_copy():
    t = torch.zeros(6, 4)
    row, col = stripes(t.shape, 2, "rows")[1], stripes(t.shape, 2, "columns")[1]
    assert row.is_view and not col.is_view
    row.take(t).fill_(1.0)
    assert t[3:].eq(1).all() and t[:3].eq(0).all()
    col.take(t).fill_(2.0)
    assert not t.eq(2).any()
    assert stripe_key("fc.weight", 3) == "fc.weight[3]"


def test_bad_axis():
    with pytest.raises(ValueError, match="axis"):
        stripes((3, 4), 2, "diagonal")


# -- stream positions ------------------------------------------------------------------------

def test_stream_positions_are_distinct():
    seen = {stream_position(t, 5, i, 3, s, 2, ph) for t in range(4) for i in range(5) for s in range(3) for ph in (0, 1)}
    assert len(seen) == 4 * 5 * 3 * 2
    assert stream_position(2, 5, 4, 3, 1, 2, 1) == ((2 * 5 + 4) * 3 + 1) * 2 + 1
    assert stream_position(2, 5, 4) == 2 * 5 + 4  # one stripe, one phase: the allgather pattern's rule


# -- the byte plan ---------------------------------------------------------------------------

def _resnet_like():
    """A conv-net-like parameter set (conv weights, biases, a classifier)."""
    shapes = [(64, 3, 7, 7), (64,)]
    for c_in, c_out in [(64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 512), (512, 512)]:
        shapes += [(c_out, c_in, 3, 3), (c_out,), (c_out,)]
    shapes += [(1000, 512), (1000,)]
    return [(f"p{i:02d}", s, torch.float32) for i, s in enumerate(shapes)]


CODECS = [("onebit", {}), ("terngrad", {}), ("qsgd", {"bits": 4})]


@pytest.mark.parametrize("name,opts", CODECS, ids=[c[0] for c in CODECS])
def test_sent_bytes_stay_about_flat_in_k(name, opts):
    """Per-rank traffic of the two-phase exchange is about (K-1)/K times one full payload plus
    one full owner payload: 2(K-1)/K full payloads (at most ~2x whatever K) when owners quantize
    again, while a plain allgather sends (K-1). TernGrad's owners send exact sums (4 bits per
    value up to K=7, 8 bits up to 127): (K-1)/K (1 + w/2) payloads, fewer than the allgather's
    from K=4 on."""
    codec = hgc.get_codec(name, **opts)
    entries = _resnet_like()
    full = sum(codec.payload_nbytes(s, dt) for _, s, dt in entries)
    sent = {}
    for k in (2, 4, 8):
        plan = StripePlan(codec, entries, k)
        owner_full = sum(plan.owner_codec.payload_nbytes(s, dt) for _, s, dt in entries)
        assert plan.exact_sum == (name == "terngrad")
        if plan.exact_sum:
            assert owner_full == pytest.approx(full * plan.owner_codec.width / 2, rel=0.02)
        per_rank = [plan.sent_bytes(r) for r in range(k)]
        sent[k] = max(per_rank)
        ideal = (k - 1) / k * (full + owner_full)
        assert max(per_rank) <= 1.03 * ideal, (k, max(per_rank), ideal)
        assert min(per_rank) >= 0.97 * ideal, (k, min(per_rank), ideal)
        assert plan.payload_bytes_phase1 <= full * 1.02 + 8 * k
        if k >= 4:
            assert sent[k] < (k - 1) * full  # fewer than the allgather's (K-1) full payloads
    if name != "terngrad":
        assert sent[4] / sent[2] < 1.55 and sent[8] / sent[4] < 1.2
        assert sent[8] < 0.3 * 7 * full


def test_sent_bytes_formula():
    codec = hgc.get_codec("terngrad")
    entries = [("a", (10,), torch.float32), ("b", (3, 4), torch.float32)]
    plan = StripePlan(codec, entries, 3)
    seg = [layout.nbytes for layout in plan.layouts]
    # stripe s of a: 4/3/3 values -> 1 byte of codes + 4 of scale; of b: 1 row of 4 -> 1 + 4
    assert [layout.payload_bytes for layout in plan.layouts] == [10, 10, 10]
    assert seg == [16, 16, 16]
    for r in range(3):
        assert plan.sent_bytes(r) == sum(seg) - seg[r] + 2 * seg[r]
    assert StripePlan(codec, entries, 1).sent_bytes(0) == 0


def test_onebit_stripes_by_columns_where_rows_would_repeat_the_scales():
    onebit, tern = hgc.get_codec("onebit", scales="columns"), hgc.get_codec("terngrad")
    # rows mode (the default): a stripe of rows carries its own rows' scales, never repeated
    assert choose_axis(hgc.get_codec("onebit"), (64, 3, 3, 3), torch.float32, 4) == "rows"
    assert choose_axis(onebit, (64, 3, 3, 3), torch.float32, 4) == "columns"
    assert choose_axis(onebit, (64,), torch.float32, 4) == "rows"
    assert choose_axis(onebit, (64, 3), torch.float32, 4) == "rows"  # fewer columns than owners
    assert choose_axis(onebit, (64, 3, 3, 3), torch.float32, 1) == "rows"
    assert choose_axis(onebit, (64, 3, 3, 3), torch.float32, 4, "rows") == "rows"
    for shape in [(64, 3, 3, 3), (1000, 512), (7, 3), (5, 1029)]:
        assert choose_axis(tern, shape, torch.float32, 2) == "rows"
        assert choose_axis(hgc.get_codec("qsgd", bits=4), shape, torch.float32, 4) == "rows"
    # the traffic rows would cost: every stripe repeats 2 float32 per column
    plan_rows = StripePlan(onebit, [("w", (256, 256, 3, 3), torch.float32)], 8, axis="rows")
    plan_auto = StripePlan(onebit, [("w", (256, 256, 3, 3), torch.float32)], 8)
    assert plan_auto.stripes["w"][0].axis == "columns"
    assert plan_rows.payload_bytes_phase1 - plan_auto.payload_bytes_phase1 == 7 * 8 * 256 * 9


def test_variable_size_codecs_are_rejected():
    for codec in (hgc.get_codec("dgc"), hgc.get_codec("qsgd", coding="elias")):
        with pytest.raises(ValueError, match="pattern='allgather'"):
            TwoPhasePattern(codec)
    with pytest.raises(ValueError, match="axis"):
        TwoPhasePattern(hgc.get_codec("onebit"), axis="diagonal")
