"""Lightning and Accelerate with a codec, each launched for real (2 CPU processes, gloo) under a timeout.

For each: the digits example trains with onebit to the accuracy of dense DDP in the same
test, with the hook run at every optimizer step and bitwise identical parameters on every
rank; resumed from the checkpoint that run wrote halfway, it ends with bitwise the
parameters of the uninterrupted run, and does not when the checkpoint's compression state is
dropped (so the state is what makes it equal). Plus the integrations' argument and state checks in-process.
"""
from __future__ import annotations

import shutil
import socket
import sys

import pytest
import torch

from launchers import BIN, last_json, run

EPOCHS, HALF = 6, 3
TIMEOUT = 240
pytestmark = pytest.mark.timeout(6 * TIMEOUT)


def lightning_proc(*args: str):
    # Lightning starts the second process itself (it re-runs the script).
    return run([sys.executable, "examples/train_lightning.py", "--devices", "2", "--json", *args], TIMEOUT)


def lightning(*args: str) -> dict:
    return last_json(lightning_proc(*args))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate(*args: str) -> dict:
    cmd = [str(BIN / "accelerate"), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
           "examples/train_accelerate.py", "--json", *args]
    return last_json(run(cmd, TIMEOUT))


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory) -> dict:
    """onebit for EPOCHS epochs with a checkpoint per epoch, and dense DDP for EPOCHS epochs."""
    ckpt = tmp_path_factory.mktemp("lightning")
    return {"codec": lightning("--codec", "onebit", "--epochs", str(EPOCHS), "--ckpt-dir", str(ckpt)),
            "dense": lightning("--codec", "none", "--epochs", str(EPOCHS)), "ckpt": ckpt}


@pytest.fixture(scope="module")
def accelerate_runs(tmp_path_factory) -> dict:
    ckpt = tmp_path_factory.mktemp("accelerate")
    return {"codec": accelerate("--codec", "onebit", "--epochs", str(EPOCHS), "--ckpt-dir", str(ckpt)),
            "dense": accelerate("--codec", "none", "--epochs", str(EPOCHS)), "ckpt": ckpt}


def check_codec_vs_dense(codec: dict, dense: dict, steps_key: str) -> None:
    for r in (codec, dense):
        assert r["ranks"] == 2 and r["params_identical"] is True and r["epochs"] == EPOCHS, r
    assert codec["hook_steps"] == codec[steps_key] > 0, codec  # the hook ran at every optimizer step
    assert codec["wire_ratio"] > 10, codec  # onebit: ~32x fewer bytes than dense fp32
    assert dense["test_accuracy"] > 0.9, dense
    assert codec["test_accuracy"] >= dense["test_accuracy"] - 0.03, (codec, dense)


def zero_floats(obj):
    """``obj`` with every floating tensor zeroed (residuals as a fresh state has them)."""
    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj) if obj.is_floating_point() else obj
    if isinstance(obj, dict):
        return {k: zero_floats(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(zero_floats(v) for v in obj)
    return obj


def check_job_state(job: dict) -> None:
    """Both ranks' states, tagged with their rank, and different (residuals are per rank)."""
    assert job["world_size"] == 2 and [s["rank"] for s in job["ranks"]] == [0, 1], job.keys()
    floats = [[t for t in _tensors(s) if t.is_floating_point()] for s in job["ranks"]]
    assert floats[0] and len(floats[0]) == len(floats[1])
    assert any(not torch.equal(a, b) for a, b in zip(*floats)), "rank 0 and rank 1 saved the same state"


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v)


# -- Lightning ----------------------------------------------------------------------------------

def test_lightning_onebit_trains_like_dense_ddp(lightning_runs):
    check_codec_vs_dense(lightning_runs["codec"], lightning_runs["dense"], "global_step")


def test_lightning_resume_continues_from_the_compression_state(lightning_runs, tmp_path):
    straight = lightning_runs["codec"]
    ckpt = lightning_runs["ckpt"] / f"epoch={HALF - 1}.ckpt"  # ModelCheckpoint's, after HALF epochs
    saved = torch.load(ckpt, weights_only=True)   # data, not code: the whole checkpoint
    check_job_state(saved["hgc_compression"])

    resumed = lightning("--codec", "onebit", "--epochs", str(EPOCHS), "--resume", str(ckpt))
    assert resumed["epochs"] == EPOCHS and resumed["global_step"] == straight["global_step"], resumed
    assert resumed["hook_steps"] == straight["global_step"] * (EPOCHS - HALF) // EPOCHS, resumed
    assert resumed["params_identical"] is True
    assert resumed["params_digest"] == straight["params_digest"], (resumed, straight)

    # Without the compression state the resumed run starts its residuals fresh: other parameters.
    del saved["hgc_compression"]
    torch.save(saved, tmp_path / "no_state.ckpt")
    proc = lightning_proc("--codec", "onebit", "--epochs", str(EPOCHS), "--resume", str(tmp_path / "no_state.ckpt"))
    assert "the compression state (error feedback etc.) starts fresh" in proc.stderr + proc.stdout
    fresh = last_json(proc)
    assert fresh["params_identical"] is True and fresh["global_step"] == straight["global_step"], fresh
    assert fresh["params_digest"] != straight["params_digest"]


def test_lightning_dgc_warmup_follows_the_epochs(tmp_path):
    """DGC (one exchange per step, its own momentum) through the strategy: the strategy tells the
    compression each epoch (its density warm-up counts epochs), as the checkpoints record."""
    dgc = lightning("--codec", "dgc", "--epochs", str(EPOCHS), "--ckpt-dir", str(tmp_path))
    assert dgc["params_identical"] is True and dgc["hook_steps"] == dgc["global_step"] > 0, dgc
    assert dgc["test_accuracy"] > 0.9, dgc
    for epoch in range(EPOCHS):
        job = torch.load(tmp_path / f"epoch={epoch}.ckpt", weights_only=True)["hgc_compression"]
        assert [_find(s, "epoch") for s in job["ranks"]] == [epoch, epoch], epoch


def _find(obj, key):
    """The first value under ``key`` in nested dicts (depth first), or None."""
    if isinstance(obj, dict):
        if key in obj:
            return obj[key]
        for v in obj.values():
            found = _find(v, key)
            if found is not None:
                return found
    return None


def test_lightning_strategy_checks_its_arguments():
    from horovod_gradcomp.integrations.lightning import CompressedDDPStrategy
    with pytest.raises(ValueError, match="unknown codec 'nope'"):
        CompressedDDPStrategy("nope")
    with pytest.raises(ValueError, match="ddp_comm_hook= conflicts"):
        CompressedDDPStrategy("onebit", ddp_comm_hook=lambda state, bucket: None)
    s = CompressedDDPStrategy("qsgd", codec_options={"pattern": "two_phase"}, find_unused_parameters=True)
    assert (s.codec, s.codec_options, s._ddp_kwargs) == ("qsgd", {"pattern": "two_phase"},
                                                          {"find_unused_parameters": True})


# -- Accelerate ---------------------------------------------------------------------------------

def test_accelerate_onebit_trains_like_dense_ddp(accelerate_runs):
    codec = accelerate_runs["codec"]
    assert codec["distributed_type"] == "DistributedType.MULTI_CPU", codec
    check_codec_vs_dense(codec, accelerate_runs["dense"], "steps")


def test_accelerate_resume_continues_from_the_compression_state(accelerate_runs, tmp_path):
    straight = accelerate_runs["codec"]
    ckpt = accelerate_runs["ckpt"] / f"epoch_{HALF}"
    # custom_checkpoint_0: the example's epoch counter; _1: the compression state (registered second).
    job = torch.load(ckpt / "custom_checkpoint_1.pkl", weights_only=True)
    check_job_state(job)

    resumed = accelerate("--codec", "onebit", "--epochs", str(EPOCHS), "--resume", str(ckpt))
    assert resumed["epochs"] == EPOCHS and resumed["steps"] == straight["steps"] * (EPOCHS - HALF) // EPOCHS, resumed
    assert resumed["params_identical"] is True
    assert resumed["params_digest"] == straight["params_digest"], (resumed, straight)

    # Residuals zeroed in the checkpoint (a fresh state): the resumed run ends elsewhere.
    fresh_ckpt = tmp_path / "fresh"
    shutil.copytree(ckpt, fresh_ckpt)
    torch.save(zero_floats(job), fresh_ckpt / "custom_checkpoint_1.pkl")
    fresh = accelerate("--codec", "onebit", "--epochs", str(EPOCHS), "--resume", str(fresh_ckpt))
    assert fresh["params_identical"] is True
    assert fresh["params_digest"] != straight["params_digest"]


def test_accelerate_register_single_process_and_wrong_model():
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState
    from horovod_gradcomp.integrations import accelerate as hgc_accelerate
    accelerator = Accelerator(cpu=True)
    try:
        model = accelerator.prepare(torch.nn.Linear(4, 2))
        assert hgc_accelerate.register(accelerator, model, "onebit") is None  # one process: nothing to exchange

        class TwoProcesses:  # what a multi-process job reports, with a model that was not prepared
            num_processes, distributed_type = 2, "MULTI_CPU"
        with pytest.raises(TypeError, match="expected the DistributedDataParallel model"):
            hgc_accelerate.register(TwoProcesses(), model, "onebit")
    finally:
        AcceleratorState._reset_state(True)


# -- the job state, in-process ------------------------------------------------------------------

def test_rank_part_refuses_another_world_size():
    from horovod_gradcomp.integrations import JobCompressionState, rank_part
    job = {"world_size": 2, "ranks": [{"rank": 0}, {"rank": 1}]}
    assert rank_part(job, 1, 2) == {"rank": 1}
    with pytest.raises(ValueError, match="compression state of 2 ranks; this job has 4"):
        rank_part(job, 0, 4)
    with pytest.raises(ValueError, match="not a job compression state"):
        rank_part({"rank": 0}, 0, 1)
    with pytest.raises(ValueError, match="written by a process other than rank 0"):
        rank_part({"world_size": 2, "ranks": None}, 0, 2)

    class Held:  # a per-rank state; no process group here: a job of one
        def __init__(self):
            self.value = {"rank": 0, "r": torch.ones(3)}

        def state_dict(self):
            return self.value

        def load_state_dict(self, s):
            self.value = s
    held = Held()
    job1 = JobCompressionState(held).state_dict()
    assert job1["world_size"] == 1 and torch.equal(job1["ranks"][0]["r"], torch.ones(3))
    JobCompressionState(held).load_state_dict({"world_size": 1, "ranks": [{"rank": 0, "r": torch.zeros(3)}]})
    assert torch.equal(held.value["r"], torch.zeros(3))


def test_lightning_with_adam_takes_the_adam_defaults():
    """The strategy's hook never sees the optimizer (Lightning creates it after the hook): the
    guard takes the codec's Adam defaults at the first step(), which under Lightning runs the
    backward inside it (its closure), so before the first exchange."""
    proc = lightning_proc("--codec", "terngrad", "--optimizer", "adam", "--lr", "0.003", "--epochs", "1")
    r = last_json(proc)
    assert r["optimizer"] == "adam" and r["adam_defaults_taken"] == {"clip": 1.0}, r
    assert r["params_identical"] is True and r["hook_steps"] == r["global_step"] > 0, r
    said = [line for line in proc.stderr.splitlines() if "took the Adam defaults" in line]
    assert said and all("clip=1.0 from step 0 on" in line for line in said), said


def test_accelerate_register_hands_an_fsdp2_model_to_hgc_fsdp():
    """A model FSDP2 shards (Accelerate's plugin with fsdp_version=2) has no DDP comm hook: register
    hands it to hgc.fsdp.register and registers the per-rank compression state for save_state (a
    one-process gloo group, in-process; tests/test_fsdp_runtime.py trains and checkpoints one at K=2)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from horovod_gradcomp.fsdp import FSDPCompressionState
    from horovod_gradcomp.integrations import JobCompressionState
    from horovod_gradcomp.integrations import accelerate as hgc_accelerate
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        model = fully_shard(torch.nn.Linear(4, 2))

        class OneProcess:   # what register uses of an Accelerator
            num_processes, distributed_type = 1, "FSDP"
            registered = []

            def register_for_checkpointing(self, *objects):
                self.registered.extend(objects)
        accelerator = OneProcess()
        state = hgc_accelerate.register(accelerator, model, "onebit")
        assert isinstance(state, FSDPCompressionState) and state.codec.name == "onebit"
        assert len(accelerator.registered) == 1 and isinstance(accelerator.registered[0], JobCompressionState)
        with pytest.raises(ValueError, match="not taken here"):   # hgc.fsdp.register's own checks apply
            hgc_accelerate.register(accelerator, fully_shard(torch.nn.Linear(4, 2)), "onebit", pattern="two_phase")
    finally:
        dist.destroy_process_group()
