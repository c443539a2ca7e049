"""The hierarchical exchange under mpirun (-np 1, 2, 3, 4), nodes laid out by ``ranks_per_node``.

Layouts: -np 4 as 2 nodes x 2 ranks, -np 2 and 3 as one rank per node (and -np 2 as one node of
2), -np 3 with ``ranks_per_node=2`` as the unequal layout [2, 1] (refused by
``pattern="hierarchical"``, flat under ``"auto"``). Every rank regenerates every rank's
gradients from seeds and recomputes the whole exchange with pure-torch pieces: the node means of
each stripe (float32 sums in local-rank order), then per shard the reference codec between the
N nodes, through the allgather or the two-phase algorithm (worker and owner error feedback,
TernGrad's shared scale and exact owner sums), from the stream positions of the shard keys. The
exchange must match it within a few float32 ulps, hold the same residuals, and give bitwise the
same result on every rank. Then: DGC and the L = 1 identity with the flat patterns, non-finite
gradients, disagreeing ranks, resume bitwise and a resume on another layout, stats.
"""
from __future__ import annotations

import math

import pytest
import torch
from mpi4py import MPI

import horovod_gradcomp as hgc
from horovod_gradcomp.errors import ExchangeMismatchError
from horovod_gradcomp.exchange.hierarchical import shard_key
from horovod_gradcomp.hvd_adapter.adam_defaults import apply_optimizer_defaults

from .mpi_helpers import LocalGradients
from .stripe_reference import part_of, put_part, ranges, ref_codec, ref_encode

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
#: 2 x 2 at -np 4, one rank per node otherwise
L = 2 if SIZE == 4 else 1
N = SIZE // L

SHAPES = {"a.bias": (5,), "b.weight": (7, 3), "c.conv": (24, 3, 3, 3), "d.one": (1,), "e.empty": (0,),
          "f.scalar": (), "g.wide": (2, 9)}
NAMES = sorted(SHAPES)
ORDER = {n: i for i, n in enumerate(NAMES)}
STEPS = 3

CODECS = {  # id: (codec, options, error feedback)
    "onebit-rows": ("onebit", {"lr_warmup_steps": 0}, True),
    "onebit-columns": ("onebit", {"scales": "columns", "lr_warmup_steps": 0}, True),
    "terngrad": ("terngrad", {"seed": 3}, False),
    "terngrad-clip-ef": ("terngrad", {"seed": 4, "clip": 2.5}, True),
    "qsgd4": ("qsgd", {"bits": 4, "bucket": 16, "norm": "max", "seed": 5}, False),
}
CASES = [(c, inner) for c in CODECS for inner in ("allgather", "two_phase")]


def grad(step, rank, name):
    """Rank ``rank``'s gradient of ``name`` at ``step`` (every rank can regenerate any)."""
    gen = torch.Generator().manual_seed(100_000 * step + 1000 * rank + ORDER[name])
    return (torch.randn(SHAPES[name], generator=gen, dtype=torch.float64) * (0.5 + ORDER[name])
            + 0.1 * rank).to(torch.float32)


def matrix(shape):
    return (shape[0], math.prod(shape[1:])) if len(shape) >= 2 else (math.prod(shape), 1)


def cut(shape, axis, k):
    """The non-empty stripes (s, a, b) of a tensor of ``shape`` among k owners along ``axis``."""
    rows, cols = matrix(shape)
    return [(s, a, b) for s, (a, b) in enumerate(ranges(rows if axis == "rows" else cols, k))
            if (b - a) * (cols if axis == "rows" else rows)]


def assert_close(got, want, magnitude, what):
    """Native vs reference: the same codes, sums in another order: a few float32 ulps."""
    torch.testing.assert_close(got, want, rtol=0, atol=8 * torch.finfo(torch.float32).eps * magnitude,
                               msg=lambda m: f"{what}: {m}")


class Expected:
    """The hierarchical exchange recomputed for all K ranks: node means, then per shard the
    reference codec between the N nodes (``inner``: the allgather or the two-phase algorithm)."""

    def __init__(self, codec_name, options, feedback, inner, axes, inner_axes):
        self.name, self.feedback, self.inner = codec_name, feedback, inner
        self.axes, self.inner_axes = axes, inner_axes
        self.refs = [ref_codec(codec_name, options, r) for r in range(SIZE)]
        self.worker = [{} for _ in range(SIZE)]  # rank -> key -> residual
        self.owner = [{} for _ in range(SIZE)]   # rank -> owner key -> residual
        self.keys = len(NAMES) * L               # P' = P x L shard keys

    def residual(self, store, key, like):
        return store.setdefault(key, torch.zeros_like(like)) if self.feedback else None

    def step(self, step):
        grads = [{n: grad(step, r, n) for n in NAMES} for r in range(SIZE)]
        out = {}
        for n in NAMES:
            result, axis = torch.zeros(SHAPES[n]), self.axes[n]
            for l, a, b in cut(SHAPES[n], axis, L):
                means = []
                for node in range(N):
                    parts = [part_of(grads[node * L + j][n], axis, a, b) for j in range(L)]
                    total = parts[0].clone()
                    for p in parts[1:]:
                        total += p
                    means.append(total / L)
                key = shard_key(n, l)
                peers = [node * L + l for node in range(N)]
                shard = (self.allgather if self.inner == "allgather" else self.two_phase)(
                    step, key, ORDER[n] * L + l, means, peers)
                put_part(result, axis, a, b, shard)
            out[n] = result
        return grads[RANK], out

    def allgather(self, step, key, index, xs, peers):
        rs = [self.residual(self.worker[p], key, x) for p, x in zip(peers, xs)]
        opts = [{}] * N
        if self.name == "terngrad":
            scale = max(self.refs[p].local_scale(x if r is None else x + r) for p, x, r in zip(peers, xs, rs))
            opts = [{"scale": scale}] * N
        decoded = []
        for p, x, r, o in zip(peers, xs, rs, opts):
            self.refs[p].reset_stream(step * self.keys + index)
            decoded.append(self.refs[p].decode(ref_encode(self.refs[p], x, r, o)))
        return (torch.stack(decoded).double().sum(0) / N).float()

    def two_phase(self, step, key, index, xs, peers):
        shape, axis = tuple(xs[0].shape), self.inner_axes[key]
        result = torch.zeros(shape)
        for s, a, b in cut(shape, axis, N):
            parts = [part_of(x, axis, a, b) for x in xs]
            rs = []
            for p, x in zip(peers, xs):
                whole = self.residual(self.worker[p], key, x)
                rs.append(None if whole is None else part_of(whole, axis, a, b))
            opts = [{}] * N
            if self.name == "terngrad":
                scale = max(self.refs[p].local_scale(x if r is None else x + r) for p, x, r in zip(peers, parts, rs))
                opts = [{"scale": scale}] * N
            decoded = []
            for p, x, r, o in zip(peers, parts, rs, opts):
                self.refs[p].reset_stream(((step * self.keys + index) * N + s) * 2)
                decoded.append(self.refs[p].decode(ref_encode(self.refs[p], x, r, o)))
                if r is not None:
                    put_part(self.worker[p][key], axis, a, b, r)
            mean = (torch.stack(decoded).double().sum(0) / N).float()
            if self.name == "terngrad":   # the owner sends the exact sum: the mean itself
                put_part(result, axis, a, b, mean)
                continue
            owner = self.refs[peers[s]]
            r_own = self.residual(self.owner[peers[s]], f"{key}[{s}]", mean)
            owner.reset_stream(((step * self.keys + index) * N + s) * 2 + 1)
            put_part(result, axis, a, b, owner.decode(ref_encode(owner, mean, r_own, {})))
        return result


def compression(codec, options, feedback=None, **kwargs):
    kwargs.setdefault("pattern", "hierarchical")
    kwargs.setdefault("ranks_per_node", L)
    extra = {} if feedback is None else {"error_feedback": feedback}
    params = [(n, torch.nn.Parameter(torch.zeros(SHAPES[n]))) for n in NAMES]
    if codec == "dgc":
        extra.update(check_optimizer=False, momentum=0.0)
    return getattr(hgc.Compression, codec)(params, transport="mpi", **extra, **options, **kwargs)


def gathered(results):
    flat = torch.cat([results[n].reshape(-1) for n in NAMES])
    return WORLD.allgather(flat)


def assert_same_on_every_rank(results):
    every = gathered(results)
    for r, other in enumerate(every):
        assert torch.equal(other, every[0]), f"rank {r}'s results differ from rank 0's"


@pytest.mark.parametrize("case,inner", CASES)
def test_matches_independent_reference(case, inner):
    codec_name, options, feedback = CODECS[case]
    comp = compression(codec_name, options, feedback, inner_pattern=inner)
    pattern = comp.engine.patterns["hierarchical"]
    expected = None
    for step in range(STEPS):
        grads = {n: grad(step, RANK, n) for n in NAMES}
        results = comp.exchange({n: g.clone() for n, g in grads.items()})
        if expected is None:   # the axes the exchange chose (a function of the codec's layout)
            assert comp.engine.layout.describe() == f"{N} nodes x {L} ranks"
            axes = {n: pattern.shards(SHAPES[n], torch.float32)[0].axis for n in NAMES}
            inner_axes = {}
            if inner == "two_phase":
                two = comp.engine.patterns["two_phase"]
                for n in NAMES:
                    for l, a, b in cut(SHAPES[n], axes[n], L):
                        key, shape = shard_key(n, l), part_of(torch.zeros(SHAPES[n]), axes[n], a, b).shape
                        inner_axes[key] = two.plan([(key, tuple(shape), torch.float32)], N).stripes[key][0].axis
            expected = Expected(codec_name, options, feedback, inner, axes, inner_axes)
        _, want = expected.step(step)
        for n in NAMES:
            magnitude = 1.0 + (grads[n].abs().max().item() if grads[n].numel() else 0.0)
            assert results[n].shape == SHAPES[n] and results[n].dtype == torch.float32
            assert_close(results[n], want[n], magnitude, f"{case}/{inner} step {step} result {n}")
        if feedback:
            residuals = comp.state.memory.residuals
            assert set(residuals) == set(expected.worker[RANK]), "worker residuals: this rank's shard keys only"
            for key, want_r in expected.worker[RANK].items():
                assert_close(residuals[key], want_r, 1.0 + 10 * len(NAMES), f"step {step} residual {key}")
            owned = comp.state.owner_memory.residuals
            assert set(owned) == set(expected.owner[RANK])
            for key, want_r in expected.owner[RANK].items():
                assert_close(owned[key], want_r, 1.0 + 10 * len(NAMES), f"step {step} owner residual {key}")
        assert_same_on_every_rank(results)


@pytest.mark.parametrize("codec,options", [("onebit", {"lr_warmup_steps": 0}), ("terngrad", {"seed": 1}),
                                           ("qsgd", {"bits": 4, "coding": "elias", "seed": 2}),
                                           ("dgc", {"density": 0.3, "seed": 3})])
def test_one_rank_per_node_is_the_flat_pattern_bitwise(codec, options):
    """L = 1: node means are the gradients, shard keys take the names' stream positions, so the
    hierarchical exchange is its inner pattern's flat exchange, bit for bit."""
    flat = "allgather"
    hier = compression(codec, options, ranks_per_node=1, inner_pattern=flat)
    plain = compression(codec, options, pattern=flat, ranks_per_node=None)
    for step in range(STEPS):
        grads = {n: grad(step, RANK, n) for n in NAMES}
        a = hier.exchange({n: g.clone() for n, g in grads.items()})
        b = plain.exchange({n: g.clone() for n, g in grads.items()})
        for n in NAMES:
            assert torch.equal(a[n], b[n]), f"{codec} step {step}: {n}"
    assert_same_on_every_rank(a)


def test_dgc_at_full_density_is_the_exact_mean():
    """DGC (variable-size payloads, its own memory keyed by shard): density 1 without momentum
    sends every value, so the result is the mean of the K gradients up to rounding."""
    comp = compression("dgc", {"density": 1.0, "seed": 1})
    for step in range(2):
        grads = {n: grad(step, RANK, n) for n in NAMES}
        results = comp.exchange({n: g.clone() for n, g in grads.items()})
        for n in NAMES:
            want = torch.stack([grad(step, r, n) for r in range(SIZE)]).double().mean(0).float()
            torch.testing.assert_close(results[n], want, rtol=1e-5, atol=1e-5)
        assert_same_on_every_rank(results)
    mine = {shard_key(n, RANK % L) for n in NAMES if SHAPES[n] != (0,)}
    assert set(comp.state.memory.accumulations) <= mine and comp.state.memory.accumulations


def test_stats_split_intra_and_inter_node_bytes():
    """Intra-node bytes: the float32 scatter and gather of the node steps, exactly; inter-node
    payload bytes of a node: at most 1/L of the flat allgather's (preambles aside)."""
    hier = compression("onebit", {"lr_warmup_steps": 0}, inner_pattern="allgather")
    flat = compression("onebit", {"lr_warmup_steps": 0}, pattern="allgather", ranks_per_node=None)
    grads = {n: grad(0, RANK, n) for n in NAMES}
    hier.exchange({n: g.clone() for n, g in grads.items()})
    flat.exchange({n: g.clone() for n, g in grads.items()})
    h, f = hier.stats(), flat.stats()
    local = RANK % L
    pattern = hier.engine.patterns["hierarchical"]
    stripes = {n: pattern.shards(SHAPES[n], torch.float32) for n in NAMES}
    shard = [sum(stripes[n][j].numel for n in NAMES) * 4 for j in range(L)]
    want_intra = sum(shard[j] for j in range(L) if j != local) + (L - 1) * shard[local]
    assert h["bytes_sent_intra_node"] == want_intra
    assert h["bytes_sent"] == h["bytes_sent_intra_node"] + h["bytes_sent_inter_node"]
    assert f["bytes_sent_intra_node"] == 0 and f["bytes_sent_inter_node"] == f["bytes_sent"]
    preamble = 24 * (SIZE - 1)
    node_inter = sum(WORLD.allgather(h["bytes_sent_inter_node"] - preamble)[RANK - local:RANK - local + L])
    node_flat = sum(WORLD.allgather(f["bytes_sent"] - preamble)[RANK - local:RANK - local + L])
    assert node_inter <= node_flat / L


def test_nonfinite_gradient_skips_the_step_everywhere():
    """A NaN on one rank in the second bucket: every result NaN on every rank, the first
    bucket's shard residuals rolled back, the step counted; the next step exchanges normally."""
    comp = compression("onebit", {"lr_warmup_steps": 0}, inner_pattern="two_phase")
    partition = [NAMES[:3], NAMES[3:]]
    comp.engine.exchange({n: grad(0, RANK, n) for n in NAMES}, partition=partition)
    before = {k: v.clone() for k, v in comp.state.memory.residuals.items()}
    owners = {k: v.clone() for k, v in comp.state.owner_memory.residuals.items()}
    grads = {n: grad(1, RANK, n) for n in NAMES}
    if RANK == SIZE - 1:
        grads["g.wide"][0, 1] = float("nan")
    results = comp.engine.exchange(grads, partition=partition)
    assert all(torch.isnan(results[n]).all() for n in NAMES if results[n].numel())
    assert comp.stats()["nonfinite_steps"] == 1
    assert set(comp.state.memory.residuals) == set(before)
    assert all(torch.equal(comp.state.memory.residuals[k], v) for k, v in before.items())
    assert all(torch.equal(comp.state.owner_memory.residuals[k], v) for k, v in owners.items())
    results = comp.engine.exchange({n: grad(2, RANK, n) for n in NAMES}, partition=partition)
    assert all(torch.isfinite(results[n]).all() for n in NAMES)
    assert_same_on_every_rank(results)


@pytest.mark.skipif(SIZE < 2, reason="needs two ranks to disagree")
def test_ranks_that_disagree_on_the_layout_fail_on_every_rank():
    """Rank 0 says one node of K, the others K nodes of 1: the preamble's digest names the
    layout, so every rank raises instead of pairing the wrong collectives."""
    comp = compression("onebit", {"lr_warmup_steps": 0}, ranks_per_node=SIZE if RANK == 0 else 1)
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        comp.exchange({n: grad(0, RANK, n) for n in NAMES})


@pytest.mark.skipif(SIZE < 2, reason="needs two ranks to disagree")
def test_ranks_that_disagree_on_shapes_fail_on_every_rank():
    comp = compression("terngrad", {"seed": 1})
    grads = {n: grad(0, RANK, n) for n in NAMES}
    if RANK == 0:
        grads["b.weight"] = torch.zeros(3, 7)
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        comp.exchange(grads)


@pytest.mark.parametrize("inner", ["allgather", "two_phase"])
def test_resume_is_bitwise_and_another_layout_is_refused(inner):
    first = compression("onebit", {"lr_warmup_steps": 0}, inner_pattern=inner)
    for step in range(2):
        first.exchange({n: grad(step, RANK, n) for n in NAMES})
    saved = first.state_dict()
    assert saved["layout"] == [list(range(s, s + L)) for s in range(0, SIZE, L)]
    a = first.exchange({n: grad(2, RANK, n) for n in NAMES})
    second = compression("onebit", {"lr_warmup_steps": 0}, inner_pattern=inner)
    second.load_state_dict(saved)
    b = second.exchange({n: grad(2, RANK, n) for n in NAMES})
    assert all(torch.equal(a[n], b[n]) for n in NAMES)
    assert all(torch.equal(first.state.memory.residuals[k], v) for k, v in second.state.memory.residuals.items())
    if SIZE > 1:   # another layout (here: the flat exchange) refuses the checkpoint, on every rank
        other = compression("onebit", {"lr_warmup_steps": 0}, pattern="allgather", ranks_per_node=None)
        other.load_state_dict(saved)
        with pytest.raises(ValueError, match="checkpoint was written by a hierarchical exchange"):
            other.exchange({n: grad(2, RANK, n) for n in NAMES})


@pytest.mark.skipif(SIZE != 3, reason="the unequal layout [2, 1] is -np 3 with ranks_per_node=2")
def test_unequal_nodes_are_refused_or_flat_under_auto():
    comp = compression("onebit", {"lr_warmup_steps": 0}, ranks_per_node=2)
    with pytest.raises(ValueError, match=r"nodes of \[2, 1\] ranks"):
        comp.exchange({n: grad(0, RANK, n) for n in NAMES})
    auto = compression("onebit", {"lr_warmup_steps": 0}, pattern="auto", ranks_per_node=2)
    flat = compression("onebit", {"lr_warmup_steps": 0}, pattern="auto", ranks_per_node=None)
    grads = {n: grad(0, RANK, n) for n in NAMES}
    a = auto.exchange({n: g.clone() for n, g in grads.items()})
    b = flat.exchange({n: g.clone() for n, g in grads.items()})
    assert auto.engine.layout is None and auto.stats()["bytes_sent_intra_node"] == 0
    assert all(torch.equal(a[n], b[n]) for n in NAMES)


@pytest.mark.skipif(SIZE != 4, reason="auto picks hierarchical on more than one node of more than one rank")
def test_auto_picks_hierarchical_on_two_nodes_of_two():
    auto = compression("terngrad", {"seed": 2}, pattern="auto")
    pinned = compression("terngrad", {"seed": 2})
    grads = {n: grad(0, RANK, n) for n in NAMES}
    a = auto.exchange({n: g.clone() for n, g in grads.items()})
    b = pinned.exchange({n: g.clone() for n, g in grads.items()})
    assert auto.engine.layout is not None and auto.stats()["bytes_sent_intra_node"] > 0
    assert all(torch.equal(a[n], b[n]) for n in NAMES)


def test_bad_options_fail_on_every_rank():
    with pytest.raises(ValueError, match="ranks_per_node must be a positive int"):
        compression("onebit", {}, ranks_per_node=0)
    with pytest.raises(ValueError, match="inner_pattern must be one of"):
        compression("onebit", {}, inner_pattern="ring")
    with pytest.raises(ValueError, match="inner_pattern='two_phase' needs a fixed-size codec"):
        compression("dgc", {"density": 0.1}, inner_pattern="two_phase")
    with pytest.raises(ValueError, match="does not take DGC's clip_norm"):
        compression("dgc", {"density": 0.1, "clip_norm": 1.0})


@pytest.mark.skipif(SIZE < 2, reason="Horovod registers its gradient hooks only when hvd.size() > 1")
@pytest.mark.parametrize("codec,options", [("onebit", {"lr_warmup_steps": 0, "residual_cap": 0.0}),
                                           ("terngrad", {"seed": 7}), ("dgc", {"density": 0.2, "seed": 8})])
def test_stock_distributed_optimizer(codec, options):
    """Through stock hvd.DistributedOptimizer, with a bucket plan and the communication thread:
    every step's gradients are bitwise what a second compression's engine makes of the same local
    gradients, and the parameters stay identical on every rank."""
    import horovod.torch as hvd
    if not hvd.is_initialized():
        hvd.init()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 6))
    named = list(model.named_parameters())
    extra = {"momentum": 0.0} if codec == "dgc" else {}
    options = dict(options, inner_pattern="allgather")   # "auto" would choose per bucket size
    comp = getattr(hgc.Compression, codec)(named, pattern="hierarchical", ranks_per_node=L, bucket_bytes=2048,
                                           **extra, **options)
    twin = compression_for(codec, named, options)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), named_parameters=named,
                                   compression=comp)
    apply_optimizer_defaults(twin, opt)   # the SGD defaults comp takes at its first compress (TernGrad's clip)
    grads = LocalGradients(named)
    for step in range(3):
        opt.zero_grad()
        model(torch.randn(8, 24, generator=torch.Generator().manual_seed(step + 10 * RANK))).pow(2).mean().backward()
        local = grads.take()
        opt.synchronize()
        want = twin.exchange(local)
        for n, p in named:
            assert torch.equal(p.grad, want[n]), f"{codec} step {step}: {n}"
        with opt.skip_synchronize():
            opt.step()
    every = WORLD.allgather(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    assert all(torch.equal(e, every[0]) for e in every)
    assert comp.stats()["bytes_sent_intra_node"] > 0 or L == 1


def compression_for(codec, named, options):
    """A second hierarchical compression of the same parameters (its engine, without Horovod)."""
    extra = {"momentum": 0.0, "check_optimizer": False} if codec == "dgc" else {}
    return getattr(hgc.Compression, codec)(named, pattern="hierarchical", ranks_per_node=L, transport="mpi",
                                           **extra, **options)
