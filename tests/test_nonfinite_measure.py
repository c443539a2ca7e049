"""The non-finite check folded into the encode (horovod_gradcomp/exchange/nonfinite_check.py).

* onebit: ``measure`` (the encode's first pass alone) then ``encode(..., scales=...)`` (the
  second alone) is bitwise the whole encode: bits, scales and residual, on the native CPU
  kernels, the twin's bucket ops and the reference; a column window's scales are the whole
  tensor's restricted to it;
* the flags: NaN, +Inf, -Inf (and +Inf with -Inf in one column) in every dtype make onebit's
  measured scales, TernGrad's local scales (clipping or not) and QSGD's payload norms non-finite;
  finite input does not;
* a step of onebit, TernGrad or QSGD never calls ``has_nonfinite`` (patched to raise), still
  skips a step with a NaN or Inf (NaN results, ``nonfinite_steps``, residuals bitwise as before);
  DGC without clipping still does (the one pass left), with clipping it takes the norm.
"""
from __future__ import annotations

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.onebit import onebit_columns
from horovod_gradcomp.exchange import nonfinite_check, preamble
from horovod_gradcomp.native import require_native, require_twin

from one_rank import OneRank

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
SHAPES = [(0,), (1,), (7,), (33,), (8 * 129 + 1,), (5, 7), (129, 3), (300, 33), (0, 5), (16, 3, 3, 3), (40, 37)]
IMPLS = ["native", "twin", "reference"]
BAD = {"nan": [float("nan")], "+inf": [float("inf")], "-inf": [float("-inf")],
       "+inf-inf": [float("inf"), float("-inf")]}


def _grad(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 0.7).to(dtype)


def _same(a, b, what):
    assert a.dtype == b.dtype and a.shape == b.shape, f"{what}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), f"{what}: bytes differ"


def _codec(impl, name="onebit", **options):
    """The codec on ``impl``; onebit in columns mode unless ``options`` say otherwise (its column
    windows and the call counts below are columns mode's; rows mode has cases of its own)."""
    if name == "onebit":
        options.setdefault("scales", "columns")
    if impl == "native":
        require_native()
    elif impl == "twin":
        require_twin()
    return hgc.get_codec(name, impl=impl, **options)


# -- onebit: measure, then pack ------------------------------------------------------
@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("impl", IMPLS)
def test_onebit_measure_then_pack_is_the_encode_bitwise(impl, dtype, with_residual):
    codec = _codec(impl)
    grads = [_grad(s, dtype, i) for i, s in enumerate(SHAPES)]
    res_a = [(_grad(s, dtype, 100 + i) * 0.3) if with_residual else None for i, s in enumerate(SHAPES)]
    res_b = [None if r is None else r.clone() for r in res_a]
    before = [None if r is None else r.clone() for r in res_a]
    for i, g in enumerate(grads):
        scales = codec.measure(g, res_b[i])
        if before[i] is not None:
            _same(res_b[i], before[i], "measure wrote the residual")
        whole = codec.encode(g, res_a[i])
        packed = codec.encode(g, res_b[i], scales=scales)
        for buf in ("bits", "scales"):
            _same(packed.buffers[buf], whole.buffers[buf], f"{impl} {SHAPES[i]} {buf}")
        if with_residual:
            _same(res_b[i], res_a[i], f"{impl} {SHAPES[i]} residual")


@pytest.mark.parametrize("with_residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("impl", IMPLS)
def test_onebit_bucket_measure_then_pack_is_the_bucket_encode_bitwise(impl, with_residual):
    """measure_many + encode_many(options=scales): one bucket op each on the twin; the payloads
    and residuals of encode_many alone; the measure with no residual equals the one with a zero
    residual (a residual not created yet)."""
    codec = _codec(impl)
    grads = [_grad(s, torch.float32, i) for i, s in enumerate(SHAPES)]
    res_a = [torch.full_like(g, 0.125) if with_residual else torch.zeros_like(g) for g in grads]
    res_b = [r.clone() for r in res_a]
    scales = codec.measure_many(grads, res_b if with_residual else None)
    whole = codec.encode_many(grads, res_a)
    packed = codec.encode_many(grads, res_b, [{"scales": s} for s in scales])
    for i, (a, b) in enumerate(zip(whole, packed)):
        for buf in ("bits", "scales"):
            _same(b.buffers[buf], a.buffers[buf], f"{impl} {SHAPES[i]} {buf}")
        _same(res_b[i], res_a[i], f"{impl} {SHAPES[i]} residual")


@pytest.mark.parametrize("impl", ["native", "twin"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
def test_onebit_window_scales_are_the_whole_tensors_restricted(impl, dtype):
    """Every window [a, b) (b - a >= 2) of a few matrices, column counts around the SSE width and
    the 1024-column tiles: the whole tensor's measured scales restricted to the window are what
    encode_columns computes, and encode_columns given them is bitwise the encode without."""
    codec = _codec(impl)
    for shape in [(5, 7), (129, 9), (300, 13), (3, 1030)]:
        g = _grad(shape, dtype, 7)
        r = _grad(shape, dtype, 8) * 0.25
        cols = onebit_columns(shape)
        full = codec.measure(g, r)
        windows = [(a, b) for a in range(cols) for b in range(a + 2, cols + 1)] if cols < 20 else \
            [(0, cols), (1, 515), (3, 1027), (1020, 1030), (511, 513)]
        for a, b in windows:
            ra, rb = r.clone(), r.clone()
            whole = codec.encode_columns(g, ra, a, b)
            given = codec.window_scales(full, cols, a, b)
            _same(given, whole.buffers["scales"], f"{impl} {shape} window [{a}, {b}) scales")
            packed = codec.encode_columns(g, rb, a, b, scales=given)
            _same(packed.buffers["bits"], whole.buffers["bits"], f"{impl} {shape} window [{a}, {b}) bits")
            _same(rb, ra, f"{impl} {shape} window [{a}, {b}) residual")


def test_onebit_given_scales_are_checked():
    codec = _codec("native")
    g = torch.randn(4, 3)
    with pytest.raises(RuntimeError, match="given scales must be a contiguous float32 tensor of 2 \\* 3"):
        codec.encode(g, None, scales=torch.zeros(5))
    with pytest.raises(RuntimeError, match="given scales"):
        codec.encode(g, None, scales=torch.zeros(6, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="2 \\* 4 values"):  # rows mode: one pair per row
        hgc.get_codec("onebit", scales="rows").encode(g, None, scales=torch.zeros(6))
    with pytest.raises(ValueError, match="every tensor or for none"):
        _codec("twin").encode_many([g, g], None, [{"scales": codec.measure(g)}, {}])


# -- the flags ---------------------------------------------------------------------
def _poisoned(shape, dtype, bad, at=(3, 10)):
    g = _grad(shape, dtype, 3)
    flat = g.view(-1)
    for j, v in enumerate(BAD[bad]):
        flat[(at[0] + j * onebit_columns(shape)) % g.numel() if len(shape) > 1 else at[j]] = v
    return g


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("impl", IMPLS)
def test_onebit_scales_flag_nan_and_inf(impl, dtype, bad):
    codec = _codec(impl)
    for shape in [(37,), (40, 6), (300, 5)]:
        g = _poisoned(shape, dtype, bad)
        scales = codec.measure_many([g], [torch.zeros_like(g)])[0]
        assert not bool(torch.isfinite(scales).all()), f"{impl} {shape} {bad}: scales {scales}"
        assert bool(torch.isfinite(codec.measure(_grad(shape, dtype, 3))).all())


@pytest.mark.parametrize("clip", [None, 2.5], ids=["noclip", "clip"])
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("impl", IMPLS)
def test_terngrad_local_scales_flag_nan_and_inf(impl, dtype, bad, clip):
    codec = _codec(impl, "terngrad", clip=clip)
    for shape in [(37,), (40, 6)]:
        g = _poisoned(shape, dtype, bad)
        units = [nonfinite_check.Unit("a", g, None), nonfinite_check.Unit("b", _grad(shape, dtype, 4), None)]
        assert nonfinite_check._measure_local(codec, units).nonfinite, f"{impl} {shape} {bad} clip={clip}"
        assert not nonfinite_check._measure_local(codec, units[1:]).nonfinite


@pytest.mark.parametrize("options", [{"bits": 4, "bucket": 16}, {"bits": 4, "bucket": 16, "norm": "max"},
                                     {"bits": 4, "bucket": 16, "coding": "elias"}],
                         ids=["l2", "max", "elias"])
@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("impl", IMPLS)
def test_qsgd_payloads_show_nan_and_inf(impl, dtype, bad, options):
    codec = _codec(impl, "qsgd", **options)
    for shape in [(37,), (40, 6)]:
        payload = codec.encode(_poisoned(shape, dtype, bad))
        assert codec.payload_nonfinite(payload), f"{impl} {shape} {bad}: norms {payload.buffers['norms']}"
        assert not codec.payload_nonfinite(codec.encode(_grad(shape, dtype, 3)))


def test_check_kinds():
    ef, off = hgc.state.ErrorFeedback(True), hgc.state.ErrorFeedback(False)
    onebit, tern, qsgd = hgc.get_codec("onebit"), hgc.get_codec("terngrad"), hgc.get_codec("qsgd")
    assert nonfinite_check.check_kind(onebit, ef, "allgather") == "measure"
    assert nonfinite_check.check_kind(onebit, off, "two_phase") == "measure"
    assert nonfinite_check.check_kind(hgc.get_codec("onebit", scales="rows"), ef, "allgather") == "measure"
    assert nonfinite_check.check_kind(onebit, ef, "dense") == "pass"
    assert nonfinite_check.check_kind(tern, off, "allgather") == "scales"
    assert nonfinite_check.check_kind(tern, ef, "two_phase") == "scales"
    assert nonfinite_check.check_kind(qsgd, off, "two_phase") == "payloads"
    assert nonfinite_check.check_kind(qsgd, ef, "allgather") == "pass"   # non-fused error feedback writes r before
    from horovod_gradcomp.state.dgc_memory import DensitySchedule, DGCMemory
    dgc = hgc.get_codec("dgc", density=0.1)
    assert nonfinite_check.check_kind(dgc, DGCMemory(DensitySchedule(0.1)), "allgather") == "pass"
    assert nonfinite_check.check_kind(dgc, DGCMemory(DensitySchedule(0.1), clip_norm=1.0), "allgather") == "norm"


# -- whole steps: no has_nonfinite, and the guarantee ---------------------------------
SHAPES_STEP = {"a.bias": (5,), "b.weight": (7, 30), "c.conv": (16, 3, 3, 3), "d.scalar": (), "e.wide": (3, 70)}
CASES = {
    "onebit": ("onebit", {}),
    "onebit-twin": ("onebit", {"impl": "twin"}),
    "onebit-noef": ("onebit", {"error_feedback": False}),
    "onebit-two_phase": ("onebit", {"pattern": "two_phase"}),
    "onebit-buckets": ("onebit", {"bucket_bytes": 600}),
    "terngrad": ("terngrad", {}),
    "terngrad-clip-two_phase": ("terngrad", {"clip": 2.5, "pattern": "two_phase"}),
    "terngrad-ef": ("terngrad", {"error_feedback": True}),
    "qsgd-fixed": ("qsgd", {"bits": 4, "bucket": 16}),
    "qsgd-elias-buckets": ("qsgd", {"bits": 4, "bucket": 16, "coding": "elias", "bucket_bytes": 600}),
    "qsgd-two_phase": ("qsgd", {"bits": 4, "bucket": 16, "pattern": "two_phase"}),
    "dgc-clip": ("dgc", {"density": 0.1, "momentum": 0.9, "clip_norm": 1.0}),
}
NO_PASS = [c for c in CASES if not c.startswith("dgc")]


def _make(case):
    name, options = CASES[case]
    named = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in SHAPES_STEP.items()]
    extra = {"check_optimizer": False} if name == "dgc" else {}
    return getattr(hgc.Compression, name)(named, communicator=OneRank(), **options, **extra)


def _grads(step, bad=None):
    out = {n: _grad(s, torch.float32, 10 * step + i) * (1 + i) for i, (n, s) in enumerate(SHAPES_STEP.items())}
    if bad is not None:
        out["c.conv"].view(-1)[7] = BAD[bad][0]
        out["e.wide"].view(-1)[3] = float("inf") if bad != "-inf" else float("-inf")
    return out


def _state(comp):
    return comp.state_dict()


def _assert_same_state(a, b, where="state"):
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            _assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        _same(a, b, where)
    elif isinstance(a, float) and a != a:
        assert b != b, where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.fixture
def no_pass(monkeypatch):
    """has_nonfinite raises: a step that still reads every gradient for the check fails."""
    def refuse(grads):
        raise AssertionError("has_nonfinite called: the non-finite check should come from the encode")
    monkeypatch.setattr(preamble, "has_nonfinite", refuse)


@pytest.mark.parametrize("bad", ["nan", "+inf", "-inf"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_skipped_step_leaves_the_state_and_calls_no_pass(case, bad, no_pass):
    """Two clean steps, one with a NaN or Inf (both buckets of a bucketed case), two clean: the
    bad step's results are all NaN, nonfinite_steps is 1, the state after it equals the state
    before it (bitwise; the step counters advance), and the later steps equal a run without it."""
    if case.endswith("twin"):
        require_twin()
    comp, clean = _make(case), _make(case)
    for t in range(3):  # the third: the plan of a bucketed case is in place
        comp.exchange(_grads(t))
        clean.exchange(_grads(t))
    before = _state(comp)
    results = comp.exchange(_grads(3, bad))
    assert all(bool(r.isnan().all()) for r in results.values() if r.numel()), "a result of the skipped step is finite"
    after = _state(comp)
    clocks = ("step", "epoch")
    _assert_same_state({k: v for k, v in before["memory_state"].items() if k not in clocks},
                       {k: v for k, v in after["memory_state"].items() if k not in clocks}, "memory")
    _assert_same_state(before["owner_memory"], after["owner_memory"], "owner memory")
    assert comp.stats()["nonfinite_steps"] == 1
    clean.state.step += 1
    if hasattr(clean.memory, "step"):
        clean.memory.step += 1
    for t in (4, 5):
        got, want = comp.exchange(_grads(t)), clean.exchange(_grads(t))
        for n in SHAPES_STEP:
            _same(got[n], want[n], f"{case}: step {t} {n} after the skipped step")


@pytest.mark.parametrize("case", NO_PASS)
def test_clean_steps_call_no_pass_and_match_the_old_check(case, monkeypatch):
    """Clean steps of onebit, TernGrad and QSGD without has_nonfinite give the results of the
    same steps with it forced (kind "pass": the encode measures its own scales then)."""
    calls = []
    real = preamble.has_nonfinite
    monkeypatch.setattr(preamble, "has_nonfinite", lambda grads: calls.append(1) or real(grads))
    if case.endswith("twin"):
        require_twin()
    comp = _make(case)
    got = [{n: r.clone() for n, r in comp.exchange(_grads(t)).items()} for t in range(3)]
    assert not calls, f"{case}: has_nonfinite called {len(calls)} times"
    monkeypatch.setattr(nonfinite_check, "check_kind", lambda codec, memory, pattern: "pass")
    old = _make(case)
    want = [{n: r.clone() for n, r in old.exchange(_grads(t)).items()} for t in range(3)]
    assert calls, "the forced pass ran"
    for t in range(3):
        for n in SHAPES_STEP:
            _same(got[t][n], want[t][n], f"{case}: step {t} {n}")
    _assert_same_state(comp.state_dict()["memory_state"], old.state_dict()["memory_state"], "memory")


def test_dgc_without_clipping_keeps_the_pass(monkeypatch):
    calls = []
    real = preamble.has_nonfinite
    monkeypatch.setattr(preamble, "has_nonfinite", lambda grads: calls.append(1) or real(grads))
    named = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in SHAPES_STEP.items()]
    comp = hgc.Compression.dgc(named, communicator=OneRank(), density=0.1, momentum=0.9, check_optimizer=False)
    comp.exchange(_grads(0))
    assert calls == [1]


def test_twin_measure_and_pack_cost_the_encodes_calls():
    """The twin's bucket op split in two: measure_many 4 device calls (block sums, column finish,
    lane totals, lane finish), the pack 1, for a bucket of matrices and 1-D tensors of one dtype:
    the 5 of the whole encode, whatever the tensor count."""
    from device_helpers import device_calls
    tw = require_twin()
    codec = _codec("twin")
    for count in (2, 12):
        grads = [_grad((9, 4) if i % 2 else (17,), torch.float32, i) for i in range(count)]
        res = [torch.zeros_like(g) for g in grads]
        box = {}
        assert device_calls(tw, lambda: box.setdefault("s", codec.measure_many(grads, res))) == 4
        options = [{"scales": s} for s in box["s"]]
        assert device_calls(tw, lambda: codec.encode_many(grads, res, options)) == 1
        assert device_calls(tw, lambda: codec.encode_many(grads, [r.clone() for r in res])) == 5
