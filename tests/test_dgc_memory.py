"""DGC's per-worker state: momentum correction, masking, clipping, warm-up, optimizer check."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.codecs.dgc import density_floor
from horovod_gradcomp.state.dgc_memory import DensitySchedule, DGCMemory
from horovod_gradcomp.hvd_adapter.optimizer_check import OptimizerMismatchError, PlainSGDGuard


def test_warmup_follows_the_papers_exponential_schedule():
    s = DensitySchedule(0.001, start=0.25, length=4, unit="epoch")
    got = [s.density(e) for e in range(7)]
    expected = [0.25 * (0.001 / 0.25) ** (e / 4) for e in range(4)] + [0.001] * 3
    assert got == pytest.approx(expected, rel=1e-15)
    # The paper's 25%, 6.25%, 1.5625%, 0.4%, then 0.1%, within rounding of the exponential form.
    assert got[:5] == pytest.approx([0.25, 0.0625, 0.015625, 0.0039, 0.001], rel=0.03)
    assert DensitySchedule(0.01).density(0) == 0.01  # length 0: no warm-up


@pytest.mark.parametrize("kwargs, match", [
    (dict(final=0.0), "density"), (dict(final=0.1, start=0.05, length=2), "warmup_start"),
    (dict(final=0.1, length=-1), "warmup_length"), (dict(final=0.1, unit="batch"), "warmup_unit")])
def test_schedule_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DensitySchedule(**kwargs)


@pytest.mark.parametrize("kwargs, match", [(dict(momentum=1.0), "momentum"), (dict(momentum=-0.1), "momentum"),
                                           (dict(clip_norm=0.0), "clip_norm"), (dict(clip_norm=True), "clip_norm"),
                                           # bool("false") is True: a flag read as a string must not turn on
                                           (dict(momentum_masking="false"), "momentum_masking must be True or False"),
                                           (dict(momentum_masking=0), "momentum_masking"),
                                           (dict(nesterov="no"), "nesterov must be True or False")])
def test_memory_rejects_bad_options(kwargs, match):
    with pytest.raises(ValueError, match=match):
        DGCMemory(DensitySchedule(0.1), **kwargs)


def encode_steps(memory, grads, codec):
    payloads = []
    for g in grads:
        payloads.append(memory.encode(codec, "w", g))
        memory.end_step()
    return payloads


@pytest.mark.parametrize("masking", [True, False])
@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_correction_and_masking_by_hand(masking, nesterov):
    torch.manual_seed(0)
    codec = hgc.get_codec("dgc", impl="reference", density=0.2)
    memory = DGCMemory(DensitySchedule(0.2), momentum=0.9, nesterov=nesterov, momentum_masking=masking)
    u = torch.zeros(50, dtype=torch.float64)
    v = torch.zeros(50, dtype=torch.float64)
    for step in range(5):
        g = torch.randn(50, dtype=torch.float64)
        payload = memory.encode(codec, "w", g)
        u = 0.9 * u + g
        v = v + (g + 0.9 * u if nesterov else u)
        top = torch.topk(v.abs(), 10).indices.sort().values
        assert torch.equal(codec.selected_indices(payload), top)
        torch.testing.assert_close(payload.buffers["values"], v[top], rtol=0, atol=1e-12)
        # What was sent leaves the accumulation; masking also clears the momentum there.
        v[top] = 0
        if masking:
            u[top] = 0
        torch.testing.assert_close(memory.accumulations["w"], v, rtol=0, atol=1e-12)
        torch.testing.assert_close(memory.velocities["w"], u, rtol=0, atol=1e-12)


def test_sent_plus_kept_equals_accumulated_velocity():
    """DGC's error-feedback identity, native selection: v_old + u_new == decoded + v_new."""
    torch.manual_seed(1)
    codec = hgc.get_codec("dgc", density=0.05)
    memory = DGCMemory(DensitySchedule(0.05), momentum=0.8, momentum_masking=False)
    for _ in range(4):
        v_old = memory.accumulations.get("w", torch.zeros(1000)).clone()
        payload = memory.encode(codec, "w", torch.randn(1000))
        decoded = codec.decode(payload)
        torch.testing.assert_close(v_old + memory.velocities["w"], decoded + memory.accumulations["w"])
        assert torch.all(memory.accumulations["w"][codec.selected_indices(payload)] == 0)


@pytest.mark.parametrize("reduction, limit", [("sum", 3.0 / 2), ("mean", 0.75 * 2)])
def test_local_clipping_scales_the_threshold_by_sqrt_k(reduction, limit):
    """Summed gradients: each rank clips to C / sqrt(K) (the paper); averaged: C * sqrt(K)."""
    clip = 3.0 if reduction == "sum" else 0.75
    memory = DGCMemory(DensitySchedule(1.0), momentum=0.0, momentum_masking=False, clip_norm=clip)
    assert memory.reduction == "mean"
    memory.set_reduction(reduction)
    assert memory.clip_limit(4) == pytest.approx(limit)
    grads = {"a": torch.full((4,), 2.0, dtype=torch.float64), "b": torch.full((5,), 2.0, dtype=torch.float64)}
    memory.begin_step(grads, world_size=4)  # norm 6, limit 1.5 either way
    codec = hgc.get_codec("dgc", impl="reference", density=1.0)
    out = codec.decode(memory.encode(codec, "a", grads["a"]))
    norm_after = 6.0 * 1.5 / (6.0 + 1e-6)
    torch.testing.assert_close(out, grads["a"] * norm_after / 6.0)
    memory.end_step()
    memory.begin_step({"a": torch.full((4,), 0.1, dtype=torch.float64)}, world_size=4)  # under the limit
    out = codec.decode(memory.encode(codec, "a", torch.full((4,), 0.1, dtype=torch.float64)))
    torch.testing.assert_close(out, torch.full((4,), 0.1, dtype=torch.float64))
    with pytest.raises(ValueError, match="reduction"):
        memory.set_reduction("max")


def test_warmup_gives_each_encode_its_density_by_epoch_and_by_step():
    codec = hgc.get_codec("dgc", impl="reference")
    by_epoch = DGCMemory(DensitySchedule(0.01, start=0.5, length=2, unit="epoch"))
    counts = []
    for epoch in range(3):
        by_epoch.set_epoch(epoch)
        counts.append(by_epoch.encode(codec, "w", torch.arange(1.0, 1001.0)).buffers["values"].numel())
    assert counts == [500, math.ceil(1000 * 0.5 * (0.02 ** 0.5)), 10]
    by_step = DGCMemory(DensitySchedule(0.01, start=0.5, length=2, unit="step"))
    sizes = [p.buffers["values"].numel() for p in encode_steps(by_step, [torch.arange(1.0, 1001.0)] * 3, codec)]
    assert sizes == counts
    with pytest.raises(ValueError, match="set_epoch"):
        by_epoch.set_epoch(-1)


def test_state_dict_round_trip():
    codec = hgc.get_codec("dgc", impl="reference", density=0.1)
    a = DGCMemory(DensitySchedule(0.1), momentum=0.9)
    encode_steps(a, [torch.randn(30, generator=torch.Generator().manual_seed(i)) for i in range(3)], codec)
    b = DGCMemory(DensitySchedule(0.1), momentum=0.9)
    b.load_state_dict(a.state_dict())
    g = torch.randn(30)
    assert torch.equal(a.encode(codec, "w", g).buffers["values"], b.encode(codec, "w", g).buffers["values"])
    assert b.step == 3
    with pytest.raises(ValueError, match="checkpoint"):
        b.encode(codec, "w", torch.randn(31))


def make_params():
    return [torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))]


def test_optimizer_guard_rejects_a_second_momentum():
    params = make_params()
    guard = PlainSGDGuard(params, owner="Compression.dgc")
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(OptimizerMismatchError, match="momentum=0"):
        torch.optim.SGD(params, lr=0.1, momentum=0.9).step()
    with pytest.raises(OptimizerMismatchError, match="momentum=0"):
        torch.optim.SGD(params, lr=0.1, momentum=0.5, nesterov=True).step()
    torch.optim.Adam(params, lr=0.1).step()   # DGC without momentum under Adam: no second momentum
    torch.optim.AdamW(params, lr=0.1).step()
    torch.optim.SGD(params, lr=0.1).step()  # plain SGD passes
    torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=0.1).step()  # not our parameters: not checked
    with pytest.warns(UserWarning, match="weight_decay"):
        torch.optim.SGD(params, lr=0.1, weight_decay=1e-4).step()
    guard.remove()
    torch.optim.SGD(params, lr=0.1, momentum=0.9).step()  # removed: no check


def test_explicit_momentum_under_another_optimizer_is_refused():
    params = make_params()
    guard = PlainSGDGuard(params, owner="Compression.dgc", momentum=0.9)
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.raises(OptimizerMismatchError, match=r"Compression.dgc: momentum=0.9 is SGD's momentum.*AdamW.*"
                                                     r"Leave momentum unset"):
        torch.optim.AdamW(params, lr=0.1).step()
    torch.optim.SGD(params, lr=0.1).step()
    guard.remove()


def test_default_momentum_under_adam_is_none_with_one_warning(monkeypatch):
    """``Compression.dgc()`` (momentum from the optimizer) under Adam/AdamW: momentum 0, said once."""
    from horovod_gradcomp.hvd_adapter import optimizer_check
    monkeypatch.setattr(optimizer_check, "_warned_without_momentum", False)
    params = make_params()
    adopted = []
    guard = PlainSGDGuard(params, owner="Compression.dgc", adopt_momentum=lambda m, n: adopted.append((m, n)))
    for p in params:
        p.grad = torch.ones_like(p)
    with pytest.warns(UserWarning, match="optimizer is Adam, not SGD: DGC runs without its .SGD. momentum correction"):
        torch.optim.Adam(params, lr=0.1).step()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.optim.AdamW(params, lr=0.1).step()   # once per process
    assert adopted == [(0.0, False), (0.0, False)]
    guard.remove()


def test_guard_goes_away_with_its_owner():
    params = make_params()
    guard = PlainSGDGuard(params, owner="x")
    del guard
    import gc
    gc.collect()
    for p in params:
        p.grad = torch.ones_like(p)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.optim.SGD(params, lr=0.1, momentum=0.9).step()


def test_guard_collected_during_a_step_does_not_break_it():
    """A guard collected while torch iterates over the global step pre-hooks (inside step())
    must not remove its hook there: that raised "OrderedDict mutated during iteration"."""
    import gc
    from torch.optim.optimizer import register_optimizer_step_pre_hook
    params = make_params()
    doomed = [PlainSGDGuard(make_params(), owner="x")]

    def collect_during_step(optimizer, args, kwargs):
        doomed.clear()
        gc.collect()
    handles = [register_optimizer_step_pre_hook(collect_during_step),
               register_optimizer_step_pre_hook(lambda optimizer, args, kwargs: None)]  # iteration goes on
    try:
        for p in params:
            p.grad = torch.ones_like(p)
        torch.optim.SGD(params, lr=0.1).step()
        torch.optim.SGD(params, lr=0.1).step()
    finally:
        for handle in handles:
            handle.remove()
    PlainSGDGuard(make_params(), owner="y").remove()  # the next guard removes the dead hook


def test_compression_dgc_factory_wires_memory_and_guard():
    params = [("w", torch.nn.Parameter(torch.zeros(10)))]
    comp = hgc.Compression.dgc(params, density=0.01, momentum=0.8, clip_norm=1.0, warmup_length=4,
                               rank_stream=0, check_optimizer=False)
    assert isinstance(comp.memory, DGCMemory) and comp.memory.momentum == 0.8
    assert comp.memory.schedule.start == 0.25 and comp.memory.schedule.length == 4
    assert comp.memory.needs_all_grads and not comp.engine._can_overlap()  # clipping needs the whole step
    assert not hasattr(comp, "optimizer_guard")
    assert "DGCMemory" in repr(comp)


def torch_accumulate(u, v, g, m, nesterov, coef):
    """The momentum correction as separate torch ops (each product and sum rounded)."""
    h = g if coef == 1.0 else g * coef
    u.mul_(m).add_(h)
    if nesterov:
        v.add_(h).add_(u * m)
    else:
        v.add_(u)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 8 * 4096 + 1, 100_003])
@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("coef", [1.0, 0.37])
def test_native_accumulate_equals_torch_ops_bit_for_bit(dtype, n, nesterov, coef):
    from horovod_gradcomp.native import require_native
    C = require_native()
    gen = torch.Generator().manual_seed(n)
    u0, v0, g = (torch.randn(n, generator=gen, dtype=dtype) for _ in range(3))
    u1, v1 = u0.clone(), v0.clone()
    C.dgc_accumulate_(u0, v0, g, 0.9, nesterov, coef)
    torch_accumulate(u1, v1, g, 0.9, nesterov, coef)
    assert torch.equal(u0, u1) and torch.equal(v0, v1)


def test_native_accumulate_rejects_bad_arguments():
    from horovod_gradcomp.native import require_native
    C = require_native()
    with pytest.raises(RuntimeError, match="one shape"):
        C.dgc_accumulate_(torch.zeros(3), torch.zeros(3), torch.zeros(4), 0.9, False)
    with pytest.raises(RuntimeError, match="fp32 or fp64"):
        C.dgc_accumulate_(torch.zeros(3).half(), torch.zeros(3).half(), torch.zeros(3).half(), 0.9, False)
    with pytest.raises(RuntimeError, match="one dtype"):
        C.dgc_accumulate_(torch.zeros(3), torch.zeros(3, dtype=torch.float64), torch.zeros(3), 0.9, False)
    with pytest.raises(RuntimeError, match="contiguous"):
        C.dgc_accumulate_(torch.zeros(3, 2).t(), torch.zeros(2, 3), torch.zeros(2, 3), 0.9, False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("nesterov", [False, True])
def test_native_and_reference_memories_agree_at_density_one(dtype, nesterov):
    """Native codec (native accumulate for fp32/fp64, torch ops for bf16) against the
    reference codec (torch ops): at density 1 both select every nonzero value."""
    mems = [DGCMemory(DensitySchedule(1.0), momentum=0.9, nesterov=nesterov, momentum_masking=False,
                      clip_norm=0.5) for _ in range(2)]
    codecs = [hgc.get_codec("dgc", impl=impl, density=1.0) for impl in ("native", "reference")]
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        g = torch.randn(5, 7, generator=gen).to(dtype)
        outs = []
        for mem, codec in zip(mems, codecs):
            mem.begin_step({"w": g}, world_size=2)
            outs.append(codec.decode(mem.encode(codec, "w", g)))
            mem.end_step()
        assert torch.equal(outs[0], outs[1])
        assert torch.equal(mems[0].velocities["w"], mems[1].velocities["w"])


def test_momentum_taken_from_the_optimizer_survives_a_resume():
    """A resumed run keeps the momentum its checkpoint recorded: the optimizer's saved groups
    hold momentum 0 (DGC took it over), so taking it again at the first step would turn DGC's
    momentum correction off."""
    def run(saved=None):
        params = make_params()
        memory = DGCMemory(DensitySchedule(0.01), momentum_from_optimizer=True)
        guard = PlainSGDGuard(params, owner="Compression.dgc", adopt_momentum=memory.adopt_momentum)
        opt = torch.optim.SGD(params, lr=0.1, momentum=0.9, nesterov=True)
        if saved is not None:
            opt.load_state_dict(saved[0])
            memory.load_state_dict(saved[1])
        for p in params:
            p.grad = torch.ones_like(p)
        opt.step()
        guard.remove()
        return opt, memory

    opt, memory = run()
    assert (memory.momentum, memory.nesterov) == (0.9, True)
    assert (opt.param_groups[0]["momentum"], opt.param_groups[0]["nesterov"]) == (0.0, False)
    opt2, resumed = run((opt.state_dict(), memory.state_dict()))
    assert (resumed.momentum, resumed.nesterov) == (0.9, True)
    assert opt2.param_groups[0]["momentum"] == 0.0


@pytest.mark.parametrize("values, floor", [(0, 0.0), (1, 1.0), (1024, 1.0), (2048, 0.5), (115_431, 1024 / 115_431),
                                           (1_024_000, 0.001), (25_557_032, 1024 / 25_557_032)])
def test_density_floor_is_min_values_over_values(values, floor):
    assert density_floor(values) == floor
    with pytest.raises(ValueError, match="values per step"):
        density_floor(-1)


def test_default_density_sends_at_least_1024_values_per_step():
    """No density given: max(0.001, 1024 / n) for n trainable values; a density given is kept, as
    is the paper's 0.001 on a model of over a million values. The floor counts the trainable
    parameters only (a frozen one is not exchanged)."""
    small = [("w", torch.nn.Parameter(torch.zeros(300, 200))), ("b", torch.nn.Parameter(torch.zeros(200)))]
    frozen = ("f", torch.nn.Parameter(torch.zeros(100_000), requires_grad=False))
    comp = hgc.Compression.dgc(small + [frozen], check_optimizer=False, momentum=0.9, impl="reference", rank_stream=0)
    assert comp.memory.current_density() == pytest.approx(1024 / 60_200)
    g = torch.randn(300, 200, generator=torch.Generator().manual_seed(0))
    payload = comp.memory.encode(comp.codec, "w", g)
    assert len(comp.codec.indices_of(payload)) == math.ceil(1024 / 60_200 * 60_000)   # exact top-k; 60 at 0.001
    given = hgc.Compression.dgc(small, density=0.001, check_optimizer=False, momentum=0.9, rank_stream=0)
    assert given.memory.current_density() == 0.001
    big = [("w", torch.nn.Parameter(torch.zeros(1000, 2000)))]
    paper = hgc.Compression.dgc(big, check_optimizer=False, momentum=0.9, rank_stream=0)
    assert paper.memory.current_density() == 0.001


def test_density_floor_travels_with_the_checkpoint():
    """A resumed run selects at the floor it was written with; a checkpoint from before the floor
    (no ``density_floor`` entry) resumes without one, as it ran."""
    memory = DGCMemory(DensitySchedule(0.001), density_given=False)
    memory.set_density_floor(0.01)
    resumed = DGCMemory(DensitySchedule(0.001), density_given=False)
    resumed.load_state_dict(memory.state_dict())
    assert resumed.current_density() == 0.01
    old = memory.state_dict()
    del old["density_floor"]
    resumed.load_state_dict(old)
    assert resumed.current_density() == 0.001
    with pytest.raises(ValueError, match="density floor"):
        memory.set_density_floor(1.5)


def test_density_floor_comes_before_the_node_mean_factor():
    """Hierarchical exchange (node means of L ranks): the floor, then L times it, at most 1."""
    memory = DGCMemory(DensitySchedule(0.001), density_given=False)
    memory.set_density_floor(0.01)
    memory.set_mean_of(4)
    assert memory.current_density() == pytest.approx(0.04)
    given = DGCMemory(DensitySchedule(0.001), density_given=True)
    given.set_density_floor(0.01)
    assert given.current_density() == 0.001
