"""A compression checkpoint is data, not code (issue 30 item 5), in one process.

Every compression state (each codec, error feedback, two-phase owners, DGC's velocities and
warm-up clock, the DDP hook's, a whole job's) loads with ``torch.load(weights_only=True)`` and
resumes bitwise; a file or part holding any other object is refused with a message, and the
object's code does not run. The same under mpirun: tests/mpi/mpi_failures.py.
"""
from __future__ import annotations

import io
import pathlib

import pytest
import torch
import torch.distributed as dist

import horovod_gradcomp as hgc
from horovod_gradcomp.state.checkpoint_data import UnsafeCheckpointError, from_bytes, load_data, to_bytes
from one_rank import OneRank

SHAPES = {"a.bias": (5,), "b.weight": (7, 30), "c.conv": (4, 3, 3, 3)}
CASES = {
    "onebit": ("onebit", {}),
    "onebit-columns-lr_warmup": ("onebit", {"scales": "columns", "lr_warmup_steps": 5, "warmup_steps": 1}),
    "terngrad-ef": ("terngrad", {"error_feedback": True}),
    "qsgd": ("qsgd", {"bits": 4, "coding": "elias"}),
    "dgc": ("dgc", {"density": 0.1, "momentum": 0.9, "check_optimizer": False, "warmup_length": 3}),
}
RAN = pathlib.Path("/tmp/hgc-test-checkpoint-data-ran")


class RunsCode:
    """An object whose unpickling runs code (writes RAN): what a checkpoint from elsewhere may hold."""

    def __reduce__(self):
        return (pathlib.Path.touch, (RAN,))


def _make(case):
    name, options = CASES[case]
    params = [(n, torch.nn.Parameter(torch.zeros(s))) for n, s in SHAPES.items()]
    return getattr(hgc.Compression, name)(params, communicator=OneRank(), **options)


def _grads(step):
    gen = torch.Generator().manual_seed(step)
    return {n: torch.randn(s, generator=gen) for n, s in SHAPES.items()}


def _run(comp, first, steps):
    return [{n: r.clone() for n, r in comp.exchange(_grads(t)).items()} for t in range(first, first + steps)]


@pytest.mark.parametrize("case", list(CASES))
def test_every_compression_state_loads_as_weights_only_and_resumes_bitwise(case):
    straight = _run(_make(case), 0, 5)
    first = _make(case)
    _run(first, 0, 3)
    buf = io.BytesIO()
    torch.save(first.state_dict(), buf)
    buf.seek(0)
    resumed = _make(case)
    resumed.load_state_dict(torch.load(buf, weights_only=True))
    for t, got in enumerate(_run(resumed, 3, 2)):
        assert all(torch.equal(got[n], straight[3 + t][n]) for n in SHAPES), f"{case}: step {3 + t}"


def test_job_state_file_loads_as_weights_only_and_resumes(tmp_path):
    path = str(tmp_path / "job.pt")
    straight = _run(_make("dgc"), 0, 4)
    comp = _make("dgc")
    _run(comp, 0, 2)
    hgc.save_job_state(comp, path)
    job = torch.load(path, weights_only=True)
    assert job["world_size"] == 1 and len(job["ranks"]) == 1
    fresh = _make("dgc")
    hgc.load_job_state(fresh, path)
    for t, got in enumerate(_run(fresh, 2, 2)):
        assert all(torch.equal(got[n], straight[2 + t][n]) for n in SHAPES)


def _refused(exc_info, where):
    text = str(exc_info.value)
    assert text.startswith(where), text
    assert "refused: it holds an object other than tensors, numbers, strings and plain containers" in text, text
    assert "data, not code" in text and "Unsupported global: GLOBAL" in text, text   # names it
    assert not RAN.exists(), "the checkpoint's object ran"


def test_a_file_holding_code_is_refused_and_does_not_run(tmp_path):
    RAN.unlink(missing_ok=True)
    path = tmp_path / "evil.pt"
    torch.save({"world_size": 1, "ranks": [{"codec": RunsCode()}]}, path)
    with pytest.raises(UnsafeCheckpointError) as info:
        hgc.load_job_state(_make("onebit"), str(path))
    _refused(info, f"load_job_state({str(path)!r})")
    with pytest.raises(UnsafeCheckpointError) as info:
        load_data(str(path), "some file")
    _refused(info, "some file")
    with pytest.raises(UnsafeCheckpointError) as info:
        from_bytes(to_bytes({"x": RunsCode()}), "rank 3's part")
    _refused(info, "rank 3's part")
    assert isinstance(info.value, ValueError)


def test_a_file_of_another_shape_is_named():
    with pytest.raises(RuntimeError, match="not a job's compression state"):
        buf = io.BytesIO()
        torch.save([1, 2], buf)
        path = "/tmp/hgc-test-checkpoint-data-list.pt"
        pathlib.Path(path).write_bytes(buf.getvalue())
        hgc.load_job_state(_make("onebit"), path)


@pytest.fixture
def gloo_world_of_one(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_ddp_hook_and_job_states_load_as_weights_only(gloo_world_of_one):
    """The DDP hook's state and the whole job's (Lightning's and Accelerate's part), gathered
    through torch.distributed in the safe format, load with weights_only=True."""
    from horovod_gradcomp.integrations import JobCompressionState
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = hgc.ddp.register(ddp, "dgc", density=0.5, momentum=0.9, check_optimizer=False)
    for step in range(2):
        ddp.zero_grad()
        ddp(torch.randn(8, 4, generator=torch.Generator().manual_seed(step))).square().sum().backward()
    for obj in (state.state_dict(), JobCompressionState(state).state_dict()):
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        loaded = torch.load(buf, weights_only=True)
        assert loaded.keys() == obj.keys()
    JobCompressionState(state).load_state_dict(loaded)
    assert state.compression.state.step == 2
