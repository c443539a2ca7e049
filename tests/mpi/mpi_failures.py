"""Nothing lost, nothing hung, under mpirun (-np 1, 2, 3, 4): bitwise resume from a checkpoint,
a non-finite gradient on one rank, ranks that disagree, Horovod options the exchange refuses.

Gradients are regenerated from seeds (rank, step, name), so every run of a case sees the same
inputs; results are compared bitwise.
"""
from __future__ import annotations

import io
import os

import horovod.torch as hvd
import pytest
import torch

import horovod_gradcomp as hgc
from horovod_gradcomp.errors import ExchangeMismatchError
from horovod_gradcomp.exchange import preamble

from .mpi_helpers import assert_identical_across_ranks, init, needs_peers

RANK, SIZE = init()
SHAPES = {"a.bias": (5,), "b.weight": (7, 30), "c.conv": (16, 3, 3, 3), "d.scalar": (), "e.wide": (3, 70)}

CASES = {  # id: (factory name, options)
    "onebit": ("onebit", {}),
    "onebit-two_phase": ("onebit", {"pattern": "two_phase"}),
    "onebit-buckets": ("onebit", {"bucket_bytes": 600}),
    "terngrad-two_phase-buckets": ("terngrad", {"pattern": "two_phase", "bucket_bytes": 600}),
    "terngrad-ef": ("terngrad", {"error_feedback": True}),
    "qsgd-fixed": ("qsgd", {"bits": 4, "bucket": 16}),
    "qsgd-elias": ("qsgd", {"bits": 4, "bucket": 16, "coding": "elias"}),
    "dgc-sampled-warmup": ("dgc", {"density": 0.05, "momentum": 0.9, "warmup_length": 4, "sample": 0.2}),
    "dgc-buckets": ("dgc", {"density": 0.1, "momentum": 0.9, "bucket_bytes": 600}),
}


def params():
    return {n: torch.nn.Parameter(torch.zeros(s)) for n, s in SHAPES.items()}


def grads_for(step: int, rank: int = RANK):
    out = {}
    for i, (n, s) in enumerate(SHAPES.items()):
        g = torch.Generator().manual_seed(1000 * step + 10 * rank + i)
        out[n] = torch.randn(s, generator=g) * (1 + i)
    return out


def make(case):
    name, options = CASES[case]
    factory = getattr(hgc.Compression, name)
    extra = {"check_optimizer": False} if name == "dgc" else {}
    return factory(list(params().items()), **options, **extra)


def run(comp, steps, first=0):
    """Results of ``steps`` exchanges starting at step ``first`` (clones)."""
    history = []
    for t in range(first, first + steps):
        history.append({n: r.clone() for n, r in comp.exchange(grads_for(t)).items()})
    return history


def assert_same_state(a: dict, b: dict, where: str) -> None:
    """Nested state dicts equal, tensors bitwise."""
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            assert_same_state(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b) or (a.isnan().all() and b.isnan().all()), where
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


@pytest.mark.parametrize("case", list(CASES))
def test_resume_is_bitwise(case):
    """Train N steps, save, fresh objects, load, train M: equal to N + M steps straight."""
    straight = run(make(case), 6)
    first = make(case)
    run(first, 3)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = make(case)
    resumed.load_state_dict(torch.load(buf, weights_only=True))   # a compression state is data
    for t, got in enumerate(run(resumed, 3, first=3)):
        for n in SHAPES:
            assert torch.equal(got[n], straight[3 + t][n]), f"{case}: step {3 + t} {n} differs after resume"


def test_dgc_checkpoint_saved_during_warmup_loads():
    comp = make("dgc-sampled-warmup")
    run(comp, 2)
    state = comp.state_dict()
    fresh = make("dgc-sampled-warmup")
    fresh.load_state_dict(state)
    assert fresh.memory.step == 2 and fresh.memory.current_density() == comp.memory.current_density()


def test_state_is_tagged_and_refused_on_another_rank_or_size():
    comp = make("onebit")
    run(comp, 1)
    state = comp.state_dict()
    assert (state["rank"], state["world_size"]) == (RANK, SIZE)
    with pytest.raises(ValueError, match=f"{SIZE + 1} ranks; this job has {SIZE}"):
        make("onebit").load_state_dict(dict(state, world_size=SIZE + 1))
    with pytest.raises(ValueError, match=f"rank {(RANK + 1) % max(SIZE, 2)}'s state; this is rank {RANK}"):
        make("onebit").load_state_dict(dict(state, rank=(RANK + 1) % max(SIZE, 2)))


@pytest.mark.parametrize("case", ["onebit-two_phase", "dgc-buckets"])
def test_job_state_in_one_file(case, tmp_path_factory):
    """save_job_state / load_job_state: one file written by rank 0, each rank gets its own part back."""
    path = os.path.join("/tmp", f"hgc-test-job-state-{os.getppid()}-{case}.pt")
    straight = run(make(case), 4)
    comp = make(case)
    run(comp, 2)
    hgc.save_job_state(comp, path)
    fresh = make(case)
    hgc.load_job_state(fresh, path)
    for t, got in enumerate(run(fresh, 2, first=2)):
        for n in SHAPES:
            assert torch.equal(got[n], straight[2 + t][n]), f"{case}: step {2 + t} {n}"
    hvd.barrier()
    if RANK == 0:
        with pytest.raises(ValueError, match="state of 9 ranks"):
            torch.save({"world_size": 9, "ranks": []}, path)
            raise_on_every_rank = None  # noqa: F841 (the collective below raises on all ranks)
            hgc.load_job_state(make(case), path)
    else:
        with pytest.raises(ValueError, match="state of 9 ranks"):
            hgc.load_job_state(make(case), path)
    hvd.barrier()
    if RANK == 0:   # a file holding code (as a checkpoint from elsewhere may): refused on every rank, not run
        torch.save({"world_size": SIZE, "ranks": [{"codec": _RunsCode()} for _ in range(SIZE)]}, path)
    hvd.barrier()
    with pytest.raises(hgc.UnsafeCheckpointError, match=r"load_job_state\(.*\): refused"):
        hgc.load_job_state(make(case), path)
    assert not os.path.exists(_RAN), "the checkpoint's object ran"
    hvd.barrier()
    if RANK == 0:
        os.remove(path)


_RAN = f"/tmp/hgc-test-job-state-ran-{os.getppid()}"


class _RunsCode:
    """Unpickling it would run code (create _RAN)."""

    def __reduce__(self):
        return (os.mkdir, (_RAN,))


NONFINITE_CASES = {  # the cases of the non-finite test beyond CASES
    "onebit-noef-two_phase": ("onebit", {"pattern": "two_phase", "error_feedback": False}),
    "onebit-two_phase-buckets": ("onebit", {"pattern": "two_phase", "bucket_bytes": 600}),
    "terngrad-clip": ("terngrad", {"clip": 2.5}),
    "qsgd-two_phase": ("qsgd", {"bits": 4, "bucket": 16, "pattern": "two_phase"}),
    "qsgd-two_phase-buckets": ("qsgd", {"bits": 4, "bucket": 16, "pattern": "two_phase", "bucket_bytes": 600}),
    "dgc-clip": ("dgc", {"density": 0.1, "momentum": 0.9, "clip_norm": 1.0}),
}
#: (tensor, flat index, value) of each kind of bad value (one tensor: the others stay finite)
BAD = {"nan-inf": [("c.conv", 7, float("nan")), ("e.wide", 3, float("inf"))],
       "nan-last": [("e.wide", 5, float("nan"))], "+inf": [("a.bias", 2, float("inf"))],
       "-inf": [("b.weight", 11, float("-inf"))]}


@pytest.mark.parametrize("bad", list(BAD))
@pytest.mark.parametrize("case", ["onebit", "onebit-two_phase", "onebit-buckets", "terngrad-two_phase-buckets",
                                  "terngrad-ef", "qsgd-fixed", "qsgd-elias", "dgc-buckets"] + list(NONFINITE_CASES))
def test_nonfinite_gradient_on_one_rank_skips_the_step_everywhere(case, bad, monkeypatch):
    """A NaN or Inf on the last rank at step 2: every rank gets all-NaN results at step 2, the
    state after it equals the state before it, and the steps after equal a run without step 2.
    No case but DGC without clipping reads the gradients for the check (has_nonfinite patched
    to raise: the encode's own first pass, the received QSGD norms, or DGC's norm give it)."""
    if case in NONFINITE_CASES:
        CASES.setdefault(case, NONFINITE_CASES[case])
    if CASES[case][0] != "dgc" or "clip_norm" in CASES[case][1]:
        def refuse(grads):
            raise AssertionError(f"{case}: has_nonfinite called")
        monkeypatch.setattr(preamble, "has_nonfinite", refuse)
    comp, clean = make(case), make(case)
    for t in range(2):
        comp.exchange(grads_for(t))
        clean.exchange(grads_for(t))
    before = comp.state_dict()
    bad_grads = grads_for(2)
    if RANK == SIZE - 1:
        for name, index, value in BAD[bad]:
            bad_grads[name].view(-1)[index] = value
    results = comp.exchange(bad_grads)
    assert all(r.isnan().all() for r in results.values() if r.numel()), "some result of the skipped step is finite"
    after = comp.state_dict()
    assert after["step"] == before["step"] + 1
    clocks = ("step", "epoch")  # DGC's warm-up clock counts the skipped step too
    assert_same_state({k: v for k, v in before["memory_state"].items() if k not in clocks},
                      {k: v for k, v in after["memory_state"].items() if k not in clocks}, "memory")
    assert_same_state(before["owner_memory"], after["owner_memory"], "owner memory")
    assert comp.stats()["nonfinite_steps"] == 1
    clean.state.step += 1  # the skipped step still advances the stream positions
    if hasattr(clean.memory, "step"):
        clean.memory.step += 1
    for t in (3, 4):
        got, want = comp.exchange(grads_for(t)), clean.exchange(grads_for(t))
        for n in SHAPES:
            assert torch.equal(got[n], want[n]), f"{case}: step {t} {n} after the skipped step"


@needs_peers
@pytest.mark.parametrize("codec,options", [("qsgd", "bits"), ("terngrad", "clip"), ("onebit", "names")])
def test_disagreeing_ranks_raise_on_every_rank(codec, options):
    """Ranks with different options or parameter sets fail with ExchangeMismatchError on every
    rank, before any collective that depends on them (shared scales, payload sizes)."""
    named = list(params().items())
    if options == "bits":
        comp = hgc.Compression.qsgd(named, bits=4 if RANK == 0 else 8)
    elif options == "clip":
        comp = hgc.Compression.terngrad(named, clip=None if RANK == 0 else 2.5)
    else:
        named = named if RANK == 0 else named[:-1]
        comp = hgc.Compression.onebit(named)
    grads = {n: g for n, g in grads_for(0).items() if n in dict(named)}
    with pytest.raises(ExchangeMismatchError, match="disagree"):
        comp.exchange(grads)


@needs_peers
def test_gradscaler_skips_the_same_step_on_every_rank():
    """torch.amp.GradScaler with Horovod: a NaN loss on one rank at one step makes every rank
    skip that step; parameters stay identical and the residuals stay finite."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    comp = hgc.Compression.onebit(model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters(), compression=comp)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    skipped = []
    for step in range(6):
        g = torch.Generator().manual_seed(100 * step + RANK)
        x, y = torch.randn(16, 20, generator=g), torch.randint(0, 4, (16,), generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        if step == 3 and RANK == SIZE - 1:
            loss = loss * float("nan")
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        before = [p.detach().clone() for p in model.parameters()]
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        if all(torch.equal(b, p) for b, p in zip(before, model.parameters())):
            skipped.append(step)
    assert skipped == [3], f"rank {RANK} skipped steps {skipped}"
    assert_identical_across_ranks(model)
    assert all(torch.isfinite(r).all() for r in comp.memory.residuals.values())
    assert comp.stats()["nonfinite_steps"] == 1


@needs_peers
def test_adasum_is_refused_at_the_first_step():
    """(Sparse gradients are supported: tests/mpi/mpi_sparse_grads.py.)"""
    model = torch.nn.Linear(4, 2)
    comp = hgc.Compression.onebit(model.named_parameters())
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), compression=comp, op=hvd.Adasum)
    with pytest.raises(hgc.UnsupportedHorovodOption, match="Adasum"):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()


@needs_peers
@pytest.mark.parametrize("option", [{"groups": 2}, {"gradient_predivide_factor": 2.0}, {"op": "sum"}])
def test_groups_predivide_and_sum_give_the_plain_optimizers_result(option):
    """``groups`` (grouped allreduce of the placeholders) and ``gradient_predivide_factor`` change
    nothing in the result; ``op=hvd.Sum`` gives K times the mean's update (checked with lr / K)."""
    def train(**kwargs):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))
        comp = hgc.Compression.onebit(model.named_parameters())
        lr = 0.1 / SIZE if kwargs.get("op") == hvd.Sum else 0.1
        opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=lr),
                                       named_parameters=model.named_parameters(), compression=comp, **kwargs)
        for step in range(3):
            g = torch.Generator().manual_seed(10 * step + RANK)
            opt.zero_grad()
            model(torch.randn(5, 6, generator=g)).pow(2).sum().backward()
            opt.step()
        return [p.detach().clone() for p in model.parameters()]
    kwargs = {"op": hvd.Sum} if option.get("op") == "sum" else option
    torch.manual_seed(0)
    initial = [p.detach().clone() for p in torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(),
                                                                torch.nn.Linear(8, 3)).parameters()]
    plain, other = train(), train(**kwargs)
    assert not any(torch.equal(a, b) for a, b in zip(initial, plain)), "training did not move the parameters"
    for a, b in zip(plain, other):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-7)
