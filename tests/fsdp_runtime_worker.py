"""torchrun worker of tests/test_fsdp_runtime.py: the stall watchdog, ``async_op`` and
``torch.compile`` with hgc.fsdp.register (CPU, gloo; tests/fsdp_worker.py's model and data).

    torchrun --nproc_per_node K tests/fsdp_runtime_worker.py stall sharded|hsdp TIMEOUT
    torchrun --nproc_per_node K tests/fsdp_runtime_worker.py async CODEC
    torchrun --nproc_per_node K tests/fsdp_runtime_worker.py fsdp_calls CODEC
    torchrun --nproc_per_node K tests/fsdp_runtime_worker.py compile CODEC BACKEND
    torchrun --nproc_per_node K tests/fsdp_runtime_worker.py accelerate CODEC DIR
    torchrun --nproc_per_node K tests/fsdp_runtime_worker.py offload CODEC NODES   (NODES 0: sharded mode)

``stall``: the last rank skips step 1 (it sleeps far longer than the test's timeout); the others
must end with the watchdog's StallError within TIMEOUT seconds. The other modes print rank 0's
JSON line at the end.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import horovod_gradcomp as hgc
from fsdp_worker import CODECS, Net, batches, build, gather_json, rank_input


def _kept_net(hsdp: bool) -> Net:
    """Net sharded over every rank, or (``hsdp``) over each pair of ranks ("shard" of a (K/2, 2)
    mesh), with the parameters kept unsharded after the forward: the backward then needs no
    all-gather, so the first collective a rank waits in after the forward is a reduce-scatter."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = None
    if hsdp:
        mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("replicate", "shard"))["shard"]
    torch.manual_seed(0)
    net = Net()
    for m in (net.inp, net.mid, net):
        fully_shard(m, mesh=mesh, reshard_after_forward=False)
    return net


def stall(mode: str, timeout: float) -> dict:
    """Step 1: every rank runs the forward; the last rank then stalls instead of the backward, so
    the others wait for it in the first compressed reduce-scatter (sharded) or replica exchange
    (HSDP: the ranks of the other pair; the stalled rank's partner waits in FSDP2's own dense
    reduce-scatter, which has the process group's timeout)."""
    k, me = dist.get_world_size(), dist.get_rank()
    net = _kept_net(mode == "hsdp")
    state = hgc.fsdp.register(net, "onebit", mode=mode, timeout=timeout)
    for step, (x, y) in enumerate(batches(3, 8, seed=me)):
        loss = torch.nn.functional.mse_loss(net(x), y)
        if step == 1 and me == k - 1:
            print(f"rank {me} stalls", flush=True)
            time.sleep(600)
        loss.backward()
        print(f"rank {me} finished step {step}", flush=True)
    return {"ok": True, "steps": state.stats()["steps"]}


def async_op(codec_key: str) -> dict:
    """Two identical registrations; each module's reduce-scatter called with the same inputs,
    synchronously on one and with ``async_op=True`` on the other, for three steps: the outputs are
    bitwise equal and the returned work is a completed ``torch.distributed.Work``."""
    name, codec_opts, reg_opts = CODECS[codec_key]
    me = dist.get_rank()
    states = [hgc.fsdp.register(build(), name, **{**codec_opts, **reg_opts}) for _ in range(2)]
    checked, equal = 0, True
    for step in range(3):
        for idx, (plain, other) in enumerate(zip(states[0].comms, states[1].comms)):
            lay = plain.layout
            x = rank_input(lay.numel, step, me, idx, lay)
            out_sync, out_async = torch.empty(lay.chunk_numel), torch.empty(lay.chunk_numel)
            assert plain(out_sync, x.clone(), None, dist.ReduceOp.AVG) is None
            work = other(out_async, x.clone(), None, dist.ReduceOp.AVG, async_op=True)
            assert isinstance(work, dist.Work), type(work)
            equal = equal and torch.equal(out_sync, out_async)   # final when the call returns, before wait()
            assert work.is_completed() and work.is_success() and work.exception() is None
            assert work.wait() is True
            assert work.get_future().wait()[0] is out_async and work.result()[0] is out_async
            equal = equal and torch.equal(out_sync, out_async)
            checked += 1
    flags = torch.tensor([float(equal)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    hgc.ddp.keep_until_exit(flags)
    return {"ok": True, "calls": checked, "equal_everywhere": bool(flags.item()),
            "steps": [s.stats()["steps"] for s in states]}


def fsdp_calls(codec_key: str) -> dict:
    """Three training steps under FSDP2 with every call of the compressed reduce-scatter recorded:
    how FSDP2 passes its arguments (positional count, keyword names) and what the call returned."""
    from horovod_gradcomp.fsdp.comm import CompressedReduceScatter
    name, codec_opts, reg_opts = CODECS[codec_key]
    codec_opts = {key: v for key, v in codec_opts.items() if key != "impl"}
    calls = []
    original = CompressedReduceScatter.__call__

    def recording(self, *args, **kwargs):
        returned = original(self, *args, **kwargs)
        calls.append({"positional": len(args), "keywords": sorted(kwargs), "returned": repr(returned)})
        return returned

    CompressedReduceScatter.__call__ = recording
    try:
        net = build()
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        reg_opts = {"momentum": 0.9} if codec_key == "dgc" else reg_opts
        state = hgc.fsdp.register(net, name, optimizer=opt, **{**codec_opts, **reg_opts})
        for x, y in batches(3, 16, seed=77 + dist.get_rank()):
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            opt.zero_grad()
    finally:
        CompressedReduceScatter.__call__ = original
    kinds = sorted({json.dumps(c, sort_keys=True) for c in calls})
    return {"ok": True, "calls": len(calls), "modules": len(state.comms), "kinds": [json.loads(c) for c in kinds]}


def compiled(codec_key: str, backend: str) -> dict:
    """The same compressed training run (12 SGD steps) twice: the model as it is and
    ``torch.compile(model, backend=backend)``. Reports both runs' losses and parameter digests on
    every rank, the compressed reduce-scatter's call counts, and how many graphs the backend was
    given (dynamo compiled the model, not only fell back to eager)."""
    from torch._dynamo import lookup_backend
    me = dist.get_rank()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return lookup_backend(backend)(gm, example_inputs)
    name, codec_opts, reg_opts = CODECS[codec_key]
    codec_opts = {key: v for key, v in codec_opts.items() if key != "impl"}
    runs = {}
    for mode in ("eager", "compiled"):
        torch._dynamo.reset()
        net = build()
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        state = hgc.fsdp.register(net, name, optimizer=opt, **{**codec_opts, **reg_opts})
        model = torch.compile(net, backend=counting) if mode == "compiled" else net
        losses = []
        for x, y in batches(12, 16, seed=77 + me):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs[mode] = {"losses": losses, "digest": shard_digest(net), "calls": state.stats()["calls"],
                      "steps": state.stats()["steps"], "graphs": len(graphs)}
    return {"ok": True, "runs": gather_json(runs)}


def offloaded(codec_key: str, nodes: int) -> dict:
    """The same compressed training run (6 SGD steps) without and with FSDP2's ``CPUOffloadPolicy``
    (sharded mode, or HSDP over ``nodes`` nodes): reports both runs' losses and parameter digests on
    every rank, the mode, and where the offloaded run keeps its sharded parameters and gradients."""
    me = dist.get_rank()
    name, codec_opts, reg_opts = CODECS[codec_key]
    codec_opts = {key: v for key, v in codec_opts.items() if key != "impl"}
    runs = {}
    for offload in (False, True):
        net = build(nodes=nodes, offload=offload)
        policies = {type(m._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
                    for m in net.modules() if hasattr(m, "_get_fsdp_state")
                    and m._get_fsdp_state()._fsdp_param_group is not None}
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
        state = hgc.fsdp.register(net, name, optimizer=opt, **{**codec_opts, **reg_opts})
        losses = []
        for x, y in batches(6, 16, seed=77 + me):
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            grads = sorted({str(p.grad.to_local().device) for p in net.parameters() if p.grad is not None})
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())
        runs["offload" if offload else "plain"] = {
            "losses": losses, "digest": shard_digest(net), "mode": state.mode, "steps": state.stats()["steps"],
            "policies": sorted(policies), "grad_devices": grads,
            "param_devices": sorted({str(p.to_local().device) for p in net.parameters()})}
    return {"ok": True, "runs": gather_json(runs)}


def shard_digest(net) -> str:
    """sha256 of this rank's parameter shards, in the model's order."""
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.to_local().detach().numpy().tobytes())
    return h.hexdigest()


def _memory_digest(state) -> str:
    h = hashlib.sha256()
    for store, tensors in state.memory.stores().items():
        for key, t in sorted(tensors.items()):
            h.update(f"{store}/{key}".encode())
            h.update(t.float().numpy().tobytes())
    return h.hexdigest()


def accelerated(codec_key: str, directory: str) -> dict:
    """hgc.integrations.accelerate.register on a model sharded by fully_shard (what Accelerate's
    FSDP2 plugin prepares on accelerators) under a multi-CPU Accelerator: 6 SGD steps, then
    ``accelerator.save_state``, 3 more steps, ``accelerator.load_state``: the compression state
    is the saved one again (digests of every rank's memory)."""
    from accelerate import Accelerator
    from horovod_gradcomp.integrations import accelerate as hgc_accelerate
    accelerator = Accelerator(cpu=True)
    me = accelerator.process_index
    name, codec_opts, reg_opts = CODECS[codec_key]
    codec_opts = {key: v for key, v in codec_opts.items() if key != "impl"}
    net = build()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.0 if codec_key == "dgc" else 0.9)
    reg_opts = {"momentum": 0.9} if codec_key == "dgc" else reg_opts
    state = hgc_accelerate.register(accelerator, net, name, optimizer=opt, **{**codec_opts, **reg_opts})
    losses = []
    data = list(batches(9, 16, seed=77 + me))

    def train(steps):
        for x, y in steps:
            loss = torch.nn.functional.mse_loss(net(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(loss.item())

    train(data[:6])
    saved = _memory_digest(state)
    accelerator.save_state(directory)
    train(data[6:])
    moved = _memory_digest(state)
    accelerator.load_state(directory)
    restored = _memory_digest(state)
    every = gather_json({"saved": saved, "moved": moved, "restored": restored})
    return {"ok": True, "mode": state.mode, "type": type(state).__name__, "steps": state.stats()["steps"],
            "memory_bytes": state.memory_bytes(), "losses": losses, "digests": every}


def main() -> None:
    mode = sys.argv[1]
    if mode != "accelerate":   # (the Accelerator initializes the process group itself)
        dist.init_process_group("gloo")
    if mode == "stall":
        result = stall(sys.argv[2], float(sys.argv[3]))
    elif mode == "async":
        result = async_op(sys.argv[2])
    elif mode == "fsdp_calls":
        result = fsdp_calls(sys.argv[2])
    elif mode == "compile":
        result = compiled(sys.argv[2], sys.argv[3])
    elif mode == "accelerate":
        result = accelerated(sys.argv[2], sys.argv[3])
    elif mode == "offload":
        result = offloaded(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
