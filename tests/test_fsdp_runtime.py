"""hgc.fsdp.register at run time (issue 40): the stall watchdog, how FSDP2 calls the reduce-scatter,
``async_op=True`` and ``torch.compile`` of the model, on CPU with gloo under torchrun (tests/fsdp_runtime_worker.py)."""
from __future__ import annotations

import subprocess
import time

import pytest

from launchers import ROOT, env, last_json, run, torchrun

pytest.importorskip("torch.distributed.fsdp")

WORKER = "tests/fsdp_runtime_worker.py"
TIMEOUT = 300
STALL_S = 3


@pytest.mark.parametrize("mode,k", [("sharded", 2), ("hsdp", 4)])
def test_a_stalled_rank_ends_the_others_with_a_stall_error(mode, k):
    """The last rank stops after step 1's forward (it sleeps 600 s): the ranks waiting for it in the
    compressed reduce-scatter (sharded) or the replica exchange (HSDP) end with the watchdog's
    StallError naming the wait, within the timeout plus start-up, and torchrun ends the job."""
    cmd = torchrun(k, WORKER, "stall", mode, str(STALL_S))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, env=env(), capture_output=True, text=True, timeout=150)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the job hung past 150 s instead of ending on the stall:\n{e.stdout}\n{e.stderr}")
    elapsed = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"the job did not fail:\n{out[-4000:]}"
    assert f"rank {k - 1} stalls" in out and "StallError: no progress for 3 s" in out, out[-4000:]
    assert "ending this process" in out and "exitcode  : 70" in out, out[-4000:]
    if mode == "sharded":
        assert "hgc.fsdp (onebit, module" in out and "step 1, reduce-scatter on rank 0 of 2, waiting for ranks [1]" \
            in out, out[-4000:]
    else:
        assert "hgc.fsdp HSDP (onebit, module" in out and "replica group of global ranks" in out, out[-4000:]
    assert f"rank {k - 1} finished step 1" not in out, out[-4000:]
    assert elapsed < 100, f"the job took {elapsed:.0f} s to end"


def test_fsdp2_calls_the_reduce_scatter_without_async_op():
    """What FSDP2 (torch 2.13) does with the custom reduce-scatter: its only call,
    torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py:619 (foreach_reduce), passes
    output_tensor, input_tensor, group and op by keyword and never async_op (so False), inside its
    reduce-scatter stream, and drops what the call returns (it orders the later work with the
    stream's event, recorded at :632). Three steps at K=2, 3 modules: 9 calls, all of that one
    form, each returning None. Should a later torch pass async_op=True, this test says so."""
    result = last_json(run(torchrun(2, WORKER, "fsdp_calls", "onebit"), timeout=TIMEOUT))
    assert result["ok"] and result["modules"] == 3 and result["calls"] == 9, result
    assert result["kinds"] == [{"positional": 0, "keywords": ["group", "input_tensor", "op", "output_tensor"],
                                "returned": "None"}], result


@pytest.mark.parametrize("codec", ["onebit", "qsgd-elias"])
def test_async_op_returns_a_completed_work_with_the_same_output(codec):
    """A caller that passes async_op=True (FSDP2 does not, see above) gets a completed
    torch.distributed.Work: the output is final when the call returns (bitwise the synchronous
    call's, before wait()), wait() returns True, the future and result() hold the output."""
    result = last_json(run(torchrun(2, WORKER, "async", codec), timeout=TIMEOUT))
    assert result["ok"] and result["calls"] == 9 and result["steps"] == [3, 3], result
    assert result["equal_everywhere"], result


def test_compiled_model_trains_bitwise_like_the_uncompiled_one():
    """torch.compile(model, backend="aot_eager") with the compressed reduce-scatter at K=2: dynamo
    compiles graphs of the model (FSDP2's hooks and the reduce-scatter run outside them, in eager),
    and the 12 losses and the final parameters of every rank equal the uncompiled run's bitwise
    (aot_eager runs the same ATen kernels; the codec sees the same gradients)."""
    result = last_json(run(torchrun(2, WORKER, "compile", "onebit", "aot_eager"), timeout=TIMEOUT))
    for rank in result["runs"]:
        eager, compiled = rank["eager"], rank["compiled"]
        assert compiled["graphs"] > 0 and eager["graphs"] == 0, rank
        assert compiled["steps"] == eager["steps"] == 12 and compiled["calls"] == eager["calls"] == 36, rank
        assert compiled["losses"] == eager["losses"], rank
        assert compiled["digest"] == eager["digest"], rank


def test_accelerate_register_takes_an_fsdp2_model_and_checkpoints_its_state(tmp_path):
    """hgc.integrations.accelerate.register on an FSDP2 model (K=2, a multi-CPU Accelerator; Accelerate's
    own FSDP2 plugin prepares such a model on accelerators only): the codec runs inside the reduce-scatter
    (sharded mode, 9 steps, the loss falls) and accelerator.save_state / load_state bring every rank's
    compression state back to what was saved after 3 more steps changed it."""
    result = last_json(run(torchrun(2, WORKER, "accelerate", "onebit", str(tmp_path / "ckpt")), timeout=TIMEOUT))
    assert result["type"] == "FSDPCompressionState" and result["mode"] == "sharded", result
    assert result["steps"] == 9 and result["memory_bytes"] > 0, result
    assert (tmp_path / "ckpt" / "custom_checkpoint_0.pkl").exists()
    for rank in result["digests"]:
        assert rank["moved"] != rank["saved"] and rank["restored"] == rank["saved"], rank


@pytest.mark.parametrize("codec,k,nodes", [("onebit", 2, 0), ("qsgd", 4, 2)])
def test_cpu_offload_trains_bitwise_like_without_it(codec, k, nodes):
    """fully_shard(..., offload_policy=CPUOffloadPolicy(pin_memory=False)) with the codec registered,
    sharded at K=2 and HSDP at 2 x 2: FSDP2 keeps the sharded parameters and gradients on the CPU as
    it does without a codec, and the 6 losses and final parameters equal the run without offload
    bitwise on every rank (on the CPU the offload moves nothing: what is checked is that register()
    and the codec's exchanges take the offloaded parameter groups as they are)."""
    result = last_json(run(torchrun(k, WORKER, "offload", codec, str(nodes)), timeout=TIMEOUT))
    for rank in result["runs"]:
        plain, offload = rank["plain"], rank["offload"]
        assert offload["policies"] == ["CPUOffloadPolicy"] and plain["policies"] == ["OffloadPolicy"], rank
        assert plain["mode"] == offload["mode"] == ("hsdp" if nodes else "sharded"), rank
        assert offload["steps"] == 6 and offload["grad_devices"] == ["cpu"] == offload["param_devices"], rank
        assert offload["losses"] == plain["losses"] and offload["digest"] == plain["digest"], rank
