"""The two-phase (owner-of-1/K) exchange under mpirun (-np 1, 2, 3, 4), no Horovod hooks.

Every rank regenerates every rank's gradients from seeds and recomputes, with the pure-torch
reference codecs and its own striping, each rank's worker encodes, the mean per stripe, the
owners' error feedback and requantization (the stochastic codecs' streams are counter-based:
the reference with the same rank_stream and position draws the same numbers). The native
exchange must match that, and give bitwise the same result on every rank.
"""
from __future__ import annotations

import math

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.two_phase import TwoPhasePattern

from .mpi_helpers import assert_alltoallv_uneven, fresh_state, gather_tensors, init, two_phase_exchange
from .stripe_reference import part_of, put_part, ranges, ref_codec, ref_encode

RANK, SIZE = init()

SHAPES = {"a.bias": (5,), "b.weight": (7, 3), "c.conv": (64, 3, 3, 3), "d.one": (1,), "e.empty": (0,),
          "f.scalar": (), "g.wide": (2, 9)}
NAMES = sorted(SHAPES)
ORDER = {n: i for i, n in enumerate(NAMES)}
STEPS = 3

CASES = {  # id: (codec, options, error feedback, axis)
    "onebit-ef": ("onebit", {"scales": "columns"}, True, "auto"),
    "onebit-ef-rows": ("onebit", {}, True, "rows"),
    "terngrad": ("terngrad", {"seed": 3}, False, "auto"),
    "terngrad-clip-ef": ("terngrad", {"seed": 4, "clip": 2.5}, True, "auto"),
    "qsgd4": ("qsgd", {"bits": 4, "bucket": 16, "norm": "max", "seed": 5}, False, "auto"),
}


def assert_close(got, want, magnitude, what):
    """Native vs reference: the same bits / codes / levels, sums in another order (native
    decode_mean_stacked accumulates in float32, the reference here in float64), so values agree to a
    few float32 ulps of the tensor's magnitude (a residual is a difference of such values)."""
    atol = 8 * torch.finfo(torch.float32).eps * magnitude
    torch.testing.assert_close(got, want, rtol=0, atol=atol, msg=lambda m: f"{what}: {m}")


def grad(step, rank, name):
    """Rank ``rank``'s gradient of ``name`` at ``step`` (every rank can regenerate any)."""
    gen = torch.Generator().manual_seed(100_000 * step + 1000 * rank + ORDER[name])
    scale = 0.5 + ORDER[name]
    return (torch.randn(SHAPES[name], generator=gen, dtype=torch.float64) * scale + 0.1 * rank).to(torch.float32)


class Expected:
    """The whole exchange recomputed for all K ranks with reference codecs."""

    def __init__(self, codec_name, options, feedback, axes):
        self.name, self.feedback, self.axes = codec_name, feedback, axes
        self.refs = [ref_codec(codec_name, options, k) for k in range(SIZE)]
        self.worker = [{n: torch.zeros(SHAPES[n]) for n in NAMES} for _ in range(SIZE)]
        self.owner = {}  # f"{name}[{s}]" -> residual (every owner's)

    def step(self, step):
        shared = self.name == "terngrad"
        grads = [{n: grad(step, k, n) for n in NAMES} for k in range(SIZE)]
        out = {}
        for n in NAMES:
            shape, axis = SHAPES[n], self.axes[n]
            rows, cols = (shape[0], math.prod(shape[1:])) if len(shape) >= 2 else (math.prod(shape), 1)
            result = torch.zeros(shape)
            for s, (a, b) in enumerate(ranges(rows if axis == "rows" else cols, SIZE)):
                if (b - a) * (cols if axis == "rows" else rows) == 0:
                    continue
                xs = [part_of(grads[k][n], axis, a, b) for k in range(SIZE)]
                rs = [part_of(self.worker[k][n], axis, a, b) if self.feedback else None for k in range(SIZE)]
                opts = [{}] * SIZE
                if shared:
                    scale = max(self.refs[k].local_scale(xs[k] if rs[k] is None else xs[k] + rs[k])
                                for k in range(SIZE))
                    opts = [{"scale": scale}] * SIZE
                decoded = []
                for k in range(SIZE):
                    self.refs[k].reset_stream(((step * len(NAMES) + ORDER[n]) * SIZE + s) * 2)
                    decoded.append(self.refs[k].decode(ref_encode(self.refs[k], xs[k], rs[k], opts[k])))
                    if self.feedback:
                        put_part(self.worker[k][n], axis, a, b, rs[k])
                mean = (torch.stack(decoded).double().sum(0) / SIZE).float()
                if shared:  # TernGrad's owner sends the exact sum (scale * integer): the mean itself
                    put_part(result, axis, a, b, mean)
                    continue
                key = f"{n}[{s}]"
                r_own = self.owner.setdefault(key, torch.zeros_like(mean)) if self.feedback else None
                owner = self.refs[s]
                owner.reset_stream(((step * len(NAMES) + ORDER[n]) * SIZE + s) * 2 + 1)
                own_opts = {"scale": owner.local_scale(mean if r_own is None else mean + r_own)} if shared else {}
                put_part(result, axis, a, b, owner.decode(ref_encode(owner, mean, r_own, own_opts)))
            out[n] = result
        return grads[RANK], out


def assert_same_on_every_rank(results):
    flat = torch.cat([results[n].reshape(-1) for n in NAMES])
    every = gather_tensors(flat)
    for r in range(every.shape[0]):
        assert torch.equal(every[r], every[0]), f"rank {r}'s results differ from rank 0's"


@pytest.mark.parametrize("case", list(CASES))
def test_matches_independent_reference(case):
    codec_name, options, use_fb, axis = CASES[case]
    opts = dict(options)
    if codec_name != "onebit":
        opts["rank_stream"] = RANK
    codec = hgc.get_codec(codec_name, impl="native", **opts)
    in_place = {"encode_columns": 0, "decode_columns": 0}
    for method in in_place:  # count the column windows encoded and decoded without copies
        def counted(*args, _method=getattr(codec, method), _name=method):
            in_place[_name] += 1
            return _method(*args)
        setattr(codec, method, counted)
    ex = TwoPhasePattern(codec, axis=axis)
    entries = [(n, SHAPES[n], torch.float32) for n in NAMES]
    plan = ex.plan(entries, SIZE)
    axes = {n: plan.stripes[n][0].axis for n in NAMES}
    if codec_name == "onebit" and axis == "auto" and SIZE > 1:
        assert axes["c.conv"] == "columns" and axes["a.bias"] == "rows"
    if axis == "rows" or codec_name != "onebit":
        assert set(axes.values()) == {"rows"}
    expected = Expected(codec_name, options, use_fb, axes)
    state = fresh_state(use_fb)
    feedback = state.memory
    for step in range(STEPS):
        state.step = step
        grads, want = expected.step(step)
        outs = {n: grads[n].clone() for n in NAMES[::2]}  # some results written into given tensors
        results, info = two_phase_exchange(ex, NAMES, grads, state, ORDER, outs=outs)
        magnitude = {n: 1.0 + (grads[n].abs().max().item() if grads[n].numel() else 0.0) for n in NAMES}
        for n in NAMES:
            got = results[n]
            assert got.shape == SHAPES[n] and got.dtype == torch.float32
            assert_close(got, want[n], magnitude[n], f"step {step} result {n}")
            if n in outs:
                assert got.data_ptr() == outs[n].data_ptr() or got.numel() == 0
            if use_fb:
                assert_close(feedback.residuals[n], expected.worker[RANK][n], magnitude[n], f"step {step} residual {n}")
        owned = {key for key in expected.owner if key.endswith(f"[{RANK}]")}
        assert set(state.owner_memory.residuals) == owned
        for key in owned:
            assert_close(state.owner_memory.residuals[key], expected.owner[key], magnitude[key.split("[")[0]],
                         f"step {step} owner residual {key}")
        assert_same_on_every_rank(results)
        assert info["k"] == SIZE and info["sent_bytes"] == plan.sent_bytes(RANK)
        assert info["payload_bytes_phase2"] == plan.owner_layouts[RANK].nbytes
        if codec_name == "terngrad":  # exact owner sums: 4-bit biased levels (K <= 7) and the scale
            assert plan.exact_sum and plan.owner_codec.width == (4 if SIZE <= 7 else 8)
            for owner, layout in enumerate(plan.owner_layouts):
                assert layout.payload_bytes == sum((math.prod(st.shape) * plan.owner_codec.width + 7) // 8 + 4
                                                   for n in NAMES for st in [plan.stripes[n][owner]] if st.numel)
        else:
            assert not plan.exact_sum and plan.owner_layouts is plan.layouts
        assert info["payload_bytes_phase1"] == sum(layout.nbytes for layout in plan.layouts)
        if SIZE == 1:
            assert info["sent_bytes"] == 0
    columns = sum(1 for n in NAMES for st in plan.stripes[n] if st.axis == "columns" and st.stop - st.start >= 2)
    # onebit's column stripes go through its CPU window kernels: every one encoded (each rank
    # encodes all K stripes) and decoded (each rank decodes every owner's stripe) in place.
    want_in_place = STEPS * columns if codec_name == "onebit" else 0
    assert in_place == {"encode_columns": want_in_place, "decode_columns": want_in_place}, in_place


def transposed_storage(t):
    """The same values as ``t`` in a non-contiguous tensor (>= 2-D), else ``t``."""
    return t.transpose(0, 1).contiguous().transpose(0, 1) if t.dim() >= 2 else t


@pytest.mark.parametrize("codec", ["onebit", "qsgd"])
def test_non_contiguous_grads_and_outs(codec):
    """Non-contiguous gradients give bitwise the result of contiguous ones and are left alone;
    a non-contiguous ``outs`` entry is not used. QSGD with 8 bits lands near the exact mean."""
    opts = {"bits": 8, "bucket": 16, "norm": "max", "rank_stream": RANK} if codec == "qsgd" else {}
    plain = {n: grad(7, RANK, n) for n in NAMES}
    grads = {n: transposed_storage(g) for n, g in plain.items()}
    assert not grads["b.weight"].is_contiguous()
    outs = {n: transposed_storage(torch.zeros(SHAPES[n])) for n in NAMES}
    results, _ = two_phase_exchange(TwoPhasePattern(hgc.get_codec(codec, **opts)), NAMES, grads, fresh_state(),
                                    ORDER, outs=outs)
    want, _ = two_phase_exchange(TwoPhasePattern(hgc.get_codec(codec, **opts)), NAMES, plain, fresh_state(), ORDER)
    for n in NAMES:
        assert torch.equal(grads[n], plain[n]) and torch.equal(results[n], want[n])
        assert results[n].is_contiguous()
        if not outs[n].is_contiguous():
            assert results[n].data_ptr() != outs[n].data_ptr() and not outs[n].any()
        if codec == "qsgd" and results[n].numel():
            exact = torch.stack([grad(7, k, n) for k in range(SIZE)]).mean(0)
            assert (results[n] - exact).abs().max().item() <= 0.05 * (1 + exact.abs().max().item())


def test_owners_without_stripes():
    """One-row tensors all belong to owner 0: the other owners requantize nothing."""
    names = ["d.one", "e.empty", "f.scalar"]
    order = {n: i for i, n in enumerate(names)}
    grads = {n: grad(3, RANK, n) for n in names}
    for codec in (hgc.get_codec("onebit"), hgc.get_codec("terngrad", rank_stream=RANK)):
        ex = TwoPhasePattern(codec)
        results, info = two_phase_exchange(ex, names, grads, fresh_state(False), order)
        one = codec.payload_nbytes((1,), torch.float32)  # d.one and f.scalar: one row each, owner 0
        assert info["payload_bytes_phase2"] == ((2 * one + 7) // 8 * 8 if RANK == 0 else 0)
        assert results["e.empty"].shape == (0,) and results["f.scalar"].shape == ()
        assert_same_on_every_rank({n: results.get(n, torch.zeros(SHAPES[n])) for n in NAMES})


def test_alltoallv_and_allgatherv_known():
    """Rank-dependent sizes, some zero: rank r sends (r + j) % 3 bytes of value 10r + j to rank j."""
    from horovod_gradcomp.transports import default_communicator
    comm = default_communicator()
    assert_alltoallv_uneven(comm)
    counts = [2 * j for j in range(SIZE)]
    parts = comm.allgatherv_known(torch.full((2 * RANK,), RANK, dtype=torch.uint8), counts)
    assert [p.tolist() for p in parts] == [[j] * (2 * j) for j in range(SIZE)]
    with pytest.raises(ValueError):
        comm.allgatherv_known(torch.zeros(1, dtype=torch.uint8), [5] * SIZE)  # local check, no collective


@pytest.mark.parametrize("codec", [("dgc", {}), ("qsgd", {"coding": "elias"})], ids=["dgc", "qsgd-elias"])
def test_variable_size_codec_is_refused_on_every_rank(codec):
    name, options = codec
    with pytest.raises(ValueError, match=f"{name}.*variable-size.*pattern='allgather'"):
        TwoPhasePattern(hgc.get_codec(name, **options))


@pytest.mark.parametrize("codec", ["onebit", "terngrad", "qsgd", "dgc"])
def test_factory_default_pattern_is_the_codecs(codec):
    """``pattern=None`` (the factories' default) takes the codec's ``default_pattern``: "auto"
    for onebit, qsgd and terngrad (two-phase from K = 3 or 4 on a large enough bucket: whichever
    sends fewer bytes), "allgather" for dgc; an explicit pattern still wins."""
    model = torch.nn.Linear(256, 256)
    expected = {"onebit": "auto", "terngrad": "auto", "qsgd": "auto", "dgc": "allgather"}[codec]
    comp = getattr(hgc.Compression, codec)(model.named_parameters())
    assert comp.engine.pattern == expected
    big = {"weight": torch.zeros(1024, 512)}  # above AUTO_MIN_BYTES for every codec here
    chosen = comp.engine.choose_pattern(big, SIZE)
    # TernGrad's exact owner sums (4 bits) make two-phase send fewer bytes from K = 4 on
    first = 4 if codec == "terngrad" else 3
    assert chosen == ("two_phase" if expected == "auto" and SIZE >= first else "allgather")
    if codec != "dgc":
        pinned = hgc.Compression.codec(codec, model.named_parameters(), pattern="allgather")
        assert pinned.engine.pattern == "allgather" and pinned.engine.choose_pattern(big, SIZE) == "allgather"
