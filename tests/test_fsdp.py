"""hgc.fsdp.register: the codecs inside FSDP2's reduce-scatter, on CPU with gloo under torchrun.

Each test launches tests/fsdp_worker.py on K processes (with a timeout) and reads rank 0's JSON
line. The model (tests/fsdp_worker.py's Net) has parameters whose dim 0 (9, 7, 5) is not a multiple
of K = 2 or 4 (at K = 3: 7 and 5 are not), a frozen bias, a parameter-free layer and a wrapped module with no parameters of
its own.
"""
from __future__ import annotations

import pytest

from launchers import last_json, run, torchrun

pytest.importorskip("torch.distributed.fsdp")

WORKER = "tests/fsdp_worker.py"
CODECS = ["onebit", "terngrad", "qsgd", "qsgd-elias", "dgc"]
TIMEOUT = 300


def launch(k: int, *args: str) -> dict:
    result = last_json(run(torchrun(k, WORKER, *args), timeout=TIMEOUT))
    assert result["ok"], result
    return result


@pytest.mark.parametrize("k", [2, 3, 4])
@pytest.mark.parametrize("codec", CODECS)
def test_reduce_scatter_matches_the_oracle(codec, k):
    """Three steps of every module's reduce-scatter (error feedback carried over for onebit, DGC's
    accumulation for dgc): the output equals the pure-torch model within float32 rounding. At K=3
    the dims 0 of 7 and 5 rows leave a padded last shard (9 rows divide evenly)."""
    result = launch(k, "oracle", codec)
    assert result["calls"] == 9   # three modules hold trainable parameters, three steps
    assert result["stats"]["steps"] == 3
    assert result["stats"]["nonfinite_steps"] == 0
    if codec in ("onebit", "terngrad", "qsgd"):   # fixed-size codecs: fewer bytes than fp32 FSDP2
        assert result["stats"]["bytes_payload"] < result["stats"]["bytes_payload_dense"]


def _train(k: int, codec: str, *options: str) -> dict:
    result = launch(k, "train", codec, *options)
    assert result["finite"], result
    return result


def test_training_with_every_codec_stays_near_dense_fsdp2():
    """60 steps of momentum SGD at K=4: every codec's loss falls, the fixed-size codecs' to within
    1.5x of dense FSDP2's; DGC (whose momentum correction and masking slow this short run) falls
    below 0.7x its start."""
    k = 4
    dense = _train(k, "dense")
    assert dense["last"] < 0.3 * dense["first"], dense
    for codec in CODECS:
        result = _train(k, codec)
        assert result["stats"]["steps"] == 60 and result["stats"]["calls"] == 180, result["stats"]
        if codec == "dgc":
            assert result["last"] < 0.7 * result["first"], result
        else:
            assert result["last"] < 1.5 * dense["last"], (codec, result["last"], dense["last"])


def test_dgc_at_full_density_without_masking_is_dense_momentum_sgd():
    """DGC with density 1 and no momentum masking sends every accumulated velocity: momentum SGD on
    the mean gradient, so the losses equal dense FSDP2 with SGD(momentum=0.9) up to rounding."""
    dense = _train(2, "dense")
    dgc = _train(2, "dgc", "density=1.0", "momentum_masking=false")
    assert dgc["last"] == pytest.approx(dense["last"], rel=1e-5)


def test_mixed_precision_bf16_params_fp32_reduce():
    result = _train(2, "onebit", "mixed=true")
    assert result["last"] < 0.5 * result["first"], result


@pytest.mark.parametrize("k", [2, 3, 4])
def test_codec_mismatch_raises_on_every_rank(k):
    result = launch(k, "mismatch")
    assert result["raised_on"] == k
    assert "disagree with rank 0" in result["message"]


def test_nonfinite_input_gives_nan_on_every_rank_and_keeps_the_memory():
    result = launch(2, "nonfinite")
    assert result["all_nan"] and result["memory_untouched"] and result["finite_after"]
    assert result["nonfinite_steps"] == 1


@pytest.mark.parametrize("k", [2, 3, 4])
def test_gradient_accumulation_reduces_once_per_module(k):
    """set_requires_gradient_sync(False) on the first micro-batch: one reduce per module, of both
    micro-batches' gradients (onebit's dense warm-up step against FSDP2's own reduce-scatter)."""
    result = launch(k, "accumulate")
    assert result["calls"] == result["modules"] == 3
    assert result["max_diff"] < 1e-6


def test_what_register_refuses_is_named():
    """An unknown codec, a Horovod/DDP-only option, a model without FSDPModule, DGC's clip_norm, a
    Shard(1) placement, a 2-D (HSDP) mesh and a bf16 residual for a codec without error feedback:
    each a clear error from register()."""
    result = launch(4, "errors")
    assert set(result["messages"]) == {"unknown codec", "refused option", "no FSDPModule", "dgc clip_norm",
                                       "Shard(1)", "2-D mesh", "residual_dtype without feedback"}


def test_hsdp_every_codec_between_nodes_keeps_replicas_identical():
    """2 x 2 at K=4 (FSDP2 over each pair, the codec across pairs): 40 steps, every replica holds
    bitwise the same shards, the loss within 1.5x of FSDP2's own dense HSDP (DGC: falls below 0.9x
    its start), and the replica traffic counted apart from the dense reduce-scatter in the node."""
    dense = launch(4, "hsdp", "dense")
    assert dense["replicas_equal"]
    for codec in CODECS:
        result = launch(4, "hsdp", codec)
        assert result["replicas_equal"], codec
        stats = result["stats"]
        assert stats["mode"] == "hsdp" and stats["steps"] == 40 and stats["calls"] == 120, stats
        assert stats["bytes_sent"] == stats["bytes_sent_replica"] + stats["bytes_sent_reduce_scatter"]
        if codec == "dgc":
            assert result["last"] < 0.9 * result["first"], result
        else:
            assert result["last"] < 1.5 * dense["last"], (codec, result["last"], dense["last"])


def test_bf16_residual_trains_and_halves_the_memory():
    """residual_dtype=torch.bfloat16: onebit at K=2 trains as well as with fp32 residuals (within
    1.2x of its loss) and its residuals take half the bytes."""
    fp32 = _train(2, "onebit")
    bf16 = _train(2, "onebit", "residual_dtype=bfloat16")
    assert bf16["last"] < 0.5 * bf16["first"], bf16
    assert bf16["last"] < 1.2 * fp32["last"], (bf16["last"], fp32["last"])
    assert fp32["stats"]["memory_bytes"] > 0
    assert bf16["stats"]["memory_bytes"] * 2 == fp32["stats"]["memory_bytes"]


@pytest.mark.parametrize("codec,options", [("onebit", ()), ("dgc", ()), ("onebit", ("residual_dtype=bfloat16",))])
def test_dcp_resume_is_bitwise(codec, options, tmp_path):
    """Train 4 steps, dcp.save model, optimizer and compression state, train 4 more; fresh processes
    dcp.load them and train the same 4: every rank's losses, parameters and residuals (DGC: velocities
    and accumulations) bitwise equal."""
    where = str(tmp_path / "ckpt")
    first = launch(2, "checkpoint", codec, where, "save", *options)
    again = launch(2, "checkpoint", codec, where, "resume", *options)
    assert first["memory_bytes"] > 0 and first["step"] == again["step"] == 8
    assert again["losses"] == first["losses"]
    assert again["digests"] == first["digests"]


@pytest.mark.parametrize("saved,loaded", [(2, 4), (4, 2)])
def test_dcp_load_at_another_world_size_is_refused_naming_both(saved, loaded, tmp_path):
    where = str(tmp_path / "ckpt")
    launch(saved, "checkpoint", "onebit", where, "save", "m=0")
    result = launch(loaded, "checkpoint", "onebit", where, "load")
    assert result["raised_on"] == loaded
    assert (f"saved torch.Size([{saved}]) and current: torch.Size([{loaded}]) for compression.world_size"
            in result["message"]), result["message"]


@pytest.mark.parametrize("codec,options", [("onebit", ()), ("dgc", ())])
def test_hsdp_dcp_resume_is_bitwise(codec, options, tmp_path):
    """HSDP mode, 2 x 2 at K=4: as the sharded test above, every rank's losses, parameters and
    compression state (each module's residuals, owner residuals; DGC: velocities and
    accumulations) bitwise equal after dcp.load in fresh processes."""
    where = str(tmp_path / "ckpt")
    first = launch(4, "checkpoint", codec, where, "save", "hsdp=2", *options)
    again = launch(4, "checkpoint", codec, where, "resume", "hsdp=2", *options)
    assert first["memory_bytes"] > 0 and first["step"] == again["step"] == 8
    assert again["losses"] == first["losses"]
    assert again["digests"] == first["digests"]


def test_hsdp_dcp_resume_keeps_the_two_phase_owner_residuals(tmp_path):
    """3 nodes of 1 rank with a 9 x 32768 layer: the replicas' exchange of that module takes the
    two-phase pattern, so each rank also holds owner residuals (its stripes' second quantization);
    they are saved and restored with the rest: the resumed run is bitwise the first."""
    where = str(tmp_path / "ckpt")
    first = launch(3, "checkpoint", "onebit", where, "save", "hsdp=3", "width=32768")
    again = launch(3, "checkpoint", "onebit", where, "resume", "hsdp=3", "width=32768")
    assert first["owner_residuals"] >= 1 and again["owner_residuals"] == first["owner_residuals"], (first, again)
    assert again["losses"] == first["losses"]
    assert again["digests"] == first["digests"]


def test_hsdp_dcp_load_at_another_world_size_is_refused_naming_both(tmp_path):
    """Saved by 2 nodes of 2 ranks, loaded by 2 nodes of 1: every rank raises, naming 4 and 2."""
    where = str(tmp_path / "ckpt")
    launch(4, "checkpoint", "onebit", where, "save", "hsdp=2", "m=0")
    result = launch(2, "checkpoint", "onebit", where, "load", "hsdp=2")
    assert result["raised_on"] == 2
    assert "saved torch.Size([4]) and current: torch.Size([2]) for compression.world_size" in result["message"], \
        result["message"]


def test_hsdp_dgc_takes_the_momentum_of_the_optimizer():
    """HSDP mode, DGC without momentum=: given optimizer=SGD(momentum=0.9), every module's compression
    takes 0.9 at register (the SGD then runs with momentum 0) and trains bitwise as momentum=0.9 with
    SGD(momentum=0) does; without optimizer= they take it at the first step()."""
    explicit = launch(4, "hsdp", "dgc")
    adopted = launch(4, "hsdp", "dgc", "adopt=register")
    assert adopted["momenta"] == [[0.9, False]] and adopted["sgd_momenta"] == [0.0], adopted
    assert adopted["losses"] == explicit["losses"]
    at_step = launch(4, "hsdp", "dgc", "adopt=step")
    assert at_step["momenta"] == [[0.9, False]] and at_step["sgd_momenta"] == [0.0], at_step
    assert at_step["replicas_equal"] and at_step["last"] < 0.9 * at_step["first"], at_step


def test_example_trains_and_reports_bytes():
    """examples/train_fsdp.py: a few steps of the character transformer under onebit, its JSON line
    with stats() (fewer bytes per step than FSDP2's own reduce-scatter)."""
    proc = run(torchrun(2, "examples/train_fsdp.py", "--codec", "onebit", "--optimizer", "sgd", "--steps", "5",
                        "--json"), timeout=TIMEOUT)
    result = last_json(proc)
    assert result["finite"] and result["stats"]["steps"] == 5, result
    assert result["stats"]["bytes_sent_per_step"] < result["stats"]["bytes_dense_per_step"] / 4
