"""torchrun worker of tests/test_fsdp.py: FSDP2 (CPU, gloo) with hgc.fsdp.register.

    torchrun --nproc_per_node K tests/fsdp_worker.py oracle CODEC [key=value ...]
    torchrun --nproc_per_node K tests/fsdp_worker.py train CODEC [key=value ...]   (CODEC "dense": none)
    torchrun --nproc_per_node K tests/fsdp_worker.py mismatch
    torchrun --nproc_per_node K tests/fsdp_worker.py nonfinite
    torchrun --nproc_per_node K tests/fsdp_worker.py accumulate
    torchrun --nproc_per_node K tests/fsdp_worker.py errors
    torchrun --nproc_per_node 4 tests/fsdp_worker.py hsdp CODEC [key=value ...]   (CODEC "dense": FSDP2's HSDP)
    torchrun --nproc_per_node K tests/fsdp_worker.py memory CODEC hsdp=NODES [key=value ...]
    torchrun --nproc_per_node K tests/fsdp_worker.py checkpoint CODEC DIR save|resume|load [key=value ...]
        (hsdp=NODES: HSDP mode, FSDP2 over each of NODES groups of ranks)

Rank 0 prints one JSON line at the end. ``oracle`` calls every registered module's reduce-scatter
with known inputs (every rank can rebuild every rank's input from the seeds) and compares the
output with a pure-torch model of the compressed reduce-scatter written here: encode each segment
of the owner's chunk of every rank with the codec's reference implementation (impl="reference")
and the rank's own residual, decode, sum in float32, times 1/K.

``HGC_FSDP_DEVICE=cuda`` (ci/gpu_check.sh's fsdp step) puts the model, the reduce-scatter's
input and output and the training batches on ``cuda:0`` (every rank on the same GPU, gloo for the
collectives); the oracle still computes its expectation on the CPU with the reference codecs.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import horovod_gradcomp as hgc
from horovod_gradcomp.exchange.stream_positions import stream_position

#: The collectives' backend: "gloo" (the default), or "nccl" (``HGC_FSDP_BACKEND=nccl``: one GPU
#: per rank, cuda:LOCAL_RANK, which ci/gpu_check.sh's fsdp step runs where it has two GPUs or more).
BACKEND = os.environ.get("HGC_FSDP_BACKEND", "gloo")
#: Where the model, the reduce-scatter buffers and the batches live ("cpu", or "cuda": cuda:0;
#: under NCCL the rank's own GPU).
DEVICE = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if BACKEND == "nccl"
          else torch.device(os.environ.get("HGC_FSDP_DEVICE", "cpu")))

#: The options the oracle and the registered compression share, per codec name given on the
#: command line (qsgd-elias: QSGD's variable-size coding; dgc: exact top-k, so impl="reference"
#: on both sides: the native selection samples a threshold).
CODECS = {
    "onebit": ("onebit", {}, {}),
    "terngrad": ("terngrad", {"seed": 3}, {}),
    "qsgd": ("qsgd", {"bits": 4, "bucket": 64, "norm": "max", "seed": 5}, {}),
    "qsgd-elias": ("qsgd", {"bits": 4, "bucket": 64, "norm": "max", "seed": 5, "coding": "elias"}, {}),
    "dgc": ("dgc", {"impl": "reference", "density": 0.25}, {"momentum": 0.0}),
}


class Net(torch.nn.Module):
    """Uneven first dim (5, 7 and 9 rows), a frozen bias, a parameter-free layer, a module with no
    parameters of its own between wrapped ones."""

    def __init__(self, width: int = 16):
        super().__init__()
        self.inp = torch.nn.Linear(width, 9)
        self.act = torch.nn.Tanh()
        self.mid = torch.nn.Sequential(torch.nn.Linear(9, 7), torch.nn.ReLU())
        self.out = torch.nn.Linear(7, 5)
        self.inp.bias.requires_grad_(False)

    def forward(self, x):
        return self.out(self.mid(self.act(self.inp(x))))


def gather_json(obj) -> list:
    """Every rank's ``obj`` (JSON-able), in rank order: an all_gather of the UTF-8 bytes instead of
    ``all_gather_object``, whose buffers a gloo worker may free last while the interpreter exits
    (the abort horovod_gradcomp/ddp/gloo_exit.py describes); the tensors here are kept until exit."""
    k = dist.get_world_size()
    mine = torch.frombuffer(bytearray(json.dumps(obj).encode()), dtype=torch.uint8)
    size = torch.tensor([mine.numel()])
    sizes = [torch.zeros_like(size) for _ in range(k)]
    dist.all_gather(sizes, size)
    padded = torch.zeros(int(max(sizes)), dtype=torch.uint8)
    padded[:mine.numel()] = mine
    every = [torch.empty_like(padded) for _ in range(k)]
    dist.all_gather(every, padded)
    hgc.ddp.keep_until_exit(size, *sizes, padded, *every)
    return [json.loads(bytes(e[:int(n)].tolist()).decode()) for e, n in zip(every, sizes)]


def build(seed: int = 0, mp=None, nodes: int = 0, width: int = 16, offload: bool = False,
          interleave: bool = False) -> Net:
    """Net (``width`` inputs) sharded by FSDP2 over every rank, or with ``nodes`` over each of
    ``nodes`` groups of ranks (the "shard" dimension of a 2-D mesh: HSDP mode's layout; node n holds
    the ranks ``n * L ...``, or with ``interleave`` the ranks ``n, n + nodes, ...``); with
    ``offload`` FSDP2's ``CPUOffloadPolicy`` (unpinned: pinning needs an accelerator)."""
    torch.manual_seed(seed)
    net = Net(width)
    kw = {} if mp is None else {"mp_policy": mp}
    if offload:
        from torch.distributed.fsdp import CPUOffloadPolicy
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=False)
    if nodes and interleave:
        from torch.distributed.device_mesh import DeviceMesh
        k = dist.get_world_size()
        ranks = torch.arange(k).view(k // nodes, nodes).T   # row n: the ranks n, n + nodes, ...
        kw["mesh"] = DeviceMesh(DEVICE.type, ranks, mesh_dim_names=("replicate", "shard"))["shard"]
    elif nodes:
        from torch.distributed.device_mesh import init_device_mesh
        k = dist.get_world_size()
        kw["mesh"] = init_device_mesh(DEVICE.type, (nodes, k // nodes), mesh_dim_names=("replicate", "shard"))["shard"]
    elif DEVICE.type != "cpu":
        from torch.distributed.device_mesh import init_device_mesh
        kw["mesh"] = init_device_mesh(DEVICE.type, (dist.get_world_size(),))
    fully_shard(net.inp, **kw)
    fully_shard(net.mid, **kw)
    fully_shard(net, **kw)
    return net


def options(argv):
    out = {}
    for a in argv:
        k, v = a.split("=", 1)
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            out[k] = getattr(torch, v) if k == "residual_dtype" else v
    return out


def rank_input(numel: int, step: int, rank: int, module: int, layout) -> torch.Tensor:
    """Rank ``rank``'s input of one call: normal values, each segment of each chunk at its own scale."""
    g = torch.Generator().manual_seed(100_000 * step + 1000 * module + rank)
    x = torch.randn(numel, generator=g)
    for j in range(layout.world_size):
        for i, v in enumerate(layout.views(x, j)):
            v.mul_(10.0 ** (i - 1))
    return x


def oracle(codec_key: str, extra: dict) -> dict:
    name, codec_opts, reg_opts = CODECS[codec_key]
    k, me = dist.get_world_size(), dist.get_rank()
    net = build()
    state = hgc.fsdp.register(net, name, **{**codec_opts, **reg_opts, **extra})
    refs = [hgc.get_codec(name, **{**codec_opts, "impl": "reference",
                                   **({"rank_stream": r} if state.codec.rank_stream is not None else {})})
            for r in range(k)]
    mine = state.codec.agreement_key().replace("impl='native'", "impl='reference'")
    assert refs[me].agreement_key() == mine, (refs[me].agreement_key(), mine)
    feedback = state.memory.enabled and not isinstance(state.memory, hgc.DGCMemory)
    dgc = isinstance(state.memory, hgc.DGCMemory)
    residuals = {}
    worst = 0.0
    checked = 0
    for step in range(3):
        for idx, comm in enumerate(state.comms):
            lay = comm.layout
            inputs = [rank_input(lay.numel, step, r, idx, lay) for r in range(k)]
            out = torch.empty(lay.chunk_numel, device=DEVICE)
            comm(out, inputs[me].to(DEVICE), state.communicator.group, dist.ReduceOp.AVG)
            assert out.device.type == DEVICE.type, out.device
            out = out.cpu()
            expect = torch.zeros(lay.chunk_numel, dtype=torch.float32)
            for seg, key, e in zip(lay.segments, lay.keys(me), lay.views(expect, me)):
                pos = stream_position(step, len(state.order), state.order[key])
                values = []
                for r in range(k):
                    g = lay.views(inputs[r], me)[lay.segments.index(seg)]
                    res = residuals.setdefault((r, key), torch.zeros_like(g))
                    values.append(g + res if (feedback or dgc) else g.clone())
                enc_opts = {}
                if getattr(refs[0], "shared_scale", False):
                    enc_opts["scale"] = max(refs[r].local_scale(values[r]) for r in range(k))
                for r in range(k):
                    refs[r].reset_stream(pos)
                    if dgc:
                        payload, _ = refs[r].encode_with_indices(values[r], density=codec_opts["density"])
                    else:
                        payload = refs[r].encode(values[r], **enc_opts)
                    decoded = refs[r].decode(payload)
                    if feedback or dgc:
                        residuals[(r, key)] = values[r] - decoded
                    e.add_(decoded.float())
            expect.mul_(1.0 / k)
            err = (out - expect).abs().max().item()
            scale = expect.abs().max().item()
            worst = max(worst, err / max(scale, 1e-12))
            checked += 1
            if not torch.allclose(out, expect, rtol=1e-5, atol=1e-5 * scale):
                bad = (out - expect).abs().argmax().item()
                raise AssertionError(f"{codec_key} step {step} module {comm.module!r} rank {me}: output differs from "
                                     f"the oracle by {err} (scale {scale}) at {bad}: {out[bad].item()} vs "
                                     f"{expect[bad].item()}")
    return {"ok": True, "codec": codec_key, "calls": checked, "worst_rel": worst, "stats": state.stats()}


def batches(steps: int, batch: int, seed: int, width: int = 16):
    """A fixed regression task: y = tanh(x A) B + noise, the same for every codec (x: ``width`` features)."""
    g = torch.Generator().manual_seed(1234)
    a, b = torch.randn(width, 12, generator=g) / 4, torch.randn(12, 5, generator=g)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(batch, width, generator=g)
        yield x.to(DEVICE), (torch.tanh(x @ a) @ b + 0.01 * torch.randn(batch, 5, generator=g)).to(DEVICE)


def mean_losses(net, opt, steps: int) -> list:
    """Train ``net`` with ``opt`` for ``steps`` minibatches of this rank's data (MSE, the output in
    float32); each step's loss averaged over the ranks."""
    k, me = dist.get_world_size(), dist.get_rank()
    losses = []
    for x, y in batches(steps, 32, seed=77 + me):
        loss = torch.nn.functional.mse_loss(net(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    every = torch.tensor(losses)   # (a CPU tensor: gloo)
    dist.all_reduce(every)
    hgc.ddp.keep_until_exit(every)   # gloo's abort at exit: see horovod_gradcomp/ddp/gloo_exit.py
    return (every / k).tolist()


def train(codec_key: str, extra: dict) -> dict:
    mp = None
    if extra.pop("mixed", False):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    net = build(mp=mp)
    lr, steps = float(extra.pop("lr", 0.05)), int(extra.pop("steps", 60))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.0 if codec_key == "dgc" else 0.9)
    state = None
    if codec_key == "dense":
        hgc.ddp.hold_backward_context(net)   # what register() does (gloo's abort at exit)
    else:
        name, codec_opts, reg_opts = CODECS[codec_key]
        codec_opts = {k_: v for k_, v in codec_opts.items() if k_ != "impl"}
        reg_opts = {"momentum": 0.9} if codec_key == "dgc" else reg_opts
        state = hgc.fsdp.register(net, name, optimizer=opt, **{**codec_opts, **reg_opts, **extra})
    losses = mean_losses(net, opt, steps)
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    return {"ok": True, "codec": codec_key, "first": first, "last": last, "finite": all(map(math.isfinite, losses)),
            "stats": None if state is None else state.stats()}


def mismatch() -> dict:
    """Rank 0 registers onebit, the others terngrad: every rank must raise ExchangeMismatchError."""
    net = build()
    hgc.fsdp.register(net, "onebit" if dist.get_rank() == 0 else "terngrad")
    x = torch.randn(4, 16)
    try:
        net(x).sum().backward()
    except hgc.ExchangeMismatchError as e:
        message = str(e)
    else:
        raise AssertionError("no ExchangeMismatchError")
    flags = torch.tensor([1.0])
    dist.all_reduce(flags)
    hgc.ddp.keep_until_exit(flags)
    return {"ok": True, "raised_on": int(flags.item()), "message": message[:300]}


def nonfinite() -> dict:
    """A NaN in rank 1's input: every rank's reduced shard is NaN, the memory is untouched, and the
    next finite step works."""
    net = build()
    state = hgc.fsdp.register(net, "onebit")
    comm = state.comms[0]
    lay = comm.layout
    x = rank_input(lay.numel, 0, dist.get_rank(), 0, lay)
    if dist.get_rank() == 1:
        x[3] = float("nan")
    out = torch.empty(lay.chunk_numel)
    comm(out, x, state.communicator.group, dist.ReduceOp.AVG)
    all_nan = bool(torch.isnan(out).all())
    untouched = state.memory_bytes() == 0
    for c in state.comms:   # close the step, then a finite one
        if c is not comm:
            c(torch.empty(c.layout.chunk_numel), torch.zeros(c.layout.numel), state.communicator.group,
              dist.ReduceOp.AVG)
    comm(out, rank_input(lay.numel, 1, dist.get_rank(), 0, lay), state.communicator.group, dist.ReduceOp.AVG)
    return {"ok": True, "all_nan": all_nan, "memory_untouched": untouched,
            "finite_after": bool(torch.isfinite(out).all()), "nonfinite_steps": state.stats()["nonfinite_steps"]}


def accumulate() -> dict:
    """Two micro-batches with set_requires_gradient_sync(False) on the first: one reduce per module,
    of the sum of both micro-batches' gradients (checked against dense FSDP2 with onebit's dense
    warm-up step, which is exact up to the float32 sum order)."""
    results = {}
    for mode in ("dense", "codec"):
        net = build()
        state = None if mode == "dense" else hgc.fsdp.register(net, "onebit", warmup_steps=1)
        g = torch.Generator().manual_seed(9 + dist.get_rank())
        xs = [torch.randn(4, 16, generator=g) for _ in range(2)]
        net.set_requires_gradient_sync(False)
        net(xs[0]).sum().backward()
        net.set_requires_gradient_sync(True)
        net(xs[1]).sum().backward()
        results[mode] = [p.grad.to_local().clone() for p in net.parameters() if p.grad is not None]
        if state is not None:
            calls = state.stats()["calls"]
    diff = max(((a - b).abs().max().item() if a.numel() else 0.0)   # K=4: some ranks' shard of a bias is empty
               for a, b in zip(results["dense"], results["codec"]))
    return {"ok": True, "calls": calls, "modules": len(state.comms), "max_diff": diff}


def hsdp(codec_key: str, extra: dict) -> dict:
    """2 x 2 at K=4: FSDP2 shards over each node's pair ("shard" of a 2-D mesh), the codec averages
    across the pairs. Trains 40 steps; reports the losses and whether replicas hold bitwise the same
    shards (a digest of every local shard, compared between the ranks at the same place)."""
    from torch.distributed.device_mesh import init_device_mesh
    k = dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, k // 2), mesh_dim_names=("replicate", "shard"))
    torch.manual_seed(0)
    net = Net()
    if codec_key == "dense":   # FSDP2's own HSDP (2-D mesh, dense all-reduce)
        for m in (net.inp, net.mid, net):
            fully_shard(m, mesh=mesh)
        hgc.ddp.hold_backward_context(net)
    else:
        for m in (net.inp, net.mid, net):
            fully_shard(m, mesh=mesh["shard"])
    # adopt="register"/"step": DGC takes the SGD's momentum (optimizer= given / not given) instead of momentum=
    adopt = extra.pop("adopt", None)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.0 if codec_key == "dgc" and not adopt else 0.9)
    state = None
    if codec_key != "dense":
        name, codec_opts, reg_opts = CODECS[codec_key]
        codec_opts = {k_: v for k_, v in codec_opts.items() if k_ != "impl"}
        if codec_key == "dgc":
            reg_opts = {} if adopt else {"momentum": 0.9}
        given = {} if adopt == "step" else {"optimizer": opt}
        state = hgc.fsdp.register(net, name, **given, **{**codec_opts, **reg_opts, **extra})
        assert state.mode == "hsdp", state
    losses = mean_losses(net, opt, 40)
    momenta = sorted({(h.compression.memory.momentum, h.compression.memory.nesterov) for h in state.hooks}) \
        if codec_key == "dgc" else None
    sgd_momenta = sorted({g["momentum"] for g in opt.param_groups})
    flat = torch.cat([p.to_local().detach().reshape(-1) for p in net.parameters()])
    digests = gather_json(hashlib.sha256(flat.numpy().tobytes()).hexdigest())
    half = k // 2
    same = all(digests[r] == digests[r + half] for r in range(half))
    return {"ok": True, "codec": codec_key, "first": sum(losses[:5]) / 5, "last": sum(losses[-5:]) / 5,
            "losses": losses, "momenta": momenta, "sgd_momenta": sgd_momenta,
            "replicas_equal": same, "stats": None if state is None else
            {key: v for key, v in state.stats().items() if key != "modules"}}


def memory(codec_key: str, extra: dict) -> dict:
    """HSDP mode over ``hsdp`` nodes (``width`` inputs): 3 training steps, then every rank's
    ``stats()["memory_bytes"]`` and ``owner_memory_bytes``, by rank (the test computes what they
    must be from the parameters' shapes)."""
    nodes, width = int(extra.pop("hsdp")), int(extra.pop("width", 16))
    net = build(nodes=nodes, width=width)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.0 if codec_key == "dgc" else 0.9)
    name, codec_opts, reg_opts = CODECS[codec_key]
    codec_opts = {k_: v for k_, v in codec_opts.items() if k_ != "impl"}
    reg_opts = {"momentum": 0.9} if codec_key == "dgc" else reg_opts
    state = hgc.fsdp.register(net, name, optimizer=opt, **{**codec_opts, **reg_opts, **extra})
    assert state.mode == "hsdp", state
    losses = []
    for x, y in batches(3, 32, seed=77 + dist.get_rank(), width=width):
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    stats = state.stats()
    every = gather_json([stats["memory_bytes"], stats["owner_memory_bytes"]])
    return {"ok": True, "finite": all(map(math.isfinite, losses)), "steps": stats["steps"],
            "memory_bytes": [m for m, _ in every], "owner_memory_bytes": [o for _, o in every]}


class _Training:
    """Model and optimizer as one DCP ``Stateful`` (torch.distributed.checkpoint.state_dict's helpers)."""

    def __init__(self, net, opt):
        self.net, self.opt = net, opt

    def state_dict(self):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        model, optim = get_state_dict(self.net, self.opt)
        return {"model": model, "optim": optim}

    def load_state_dict(self, sd):
        from torch.distributed.checkpoint.state_dict import set_state_dict
        set_state_dict(self.net, self.opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])


def checkpoint(codec_key: str, directory: str, phase: str, extra: dict) -> dict:
    """DCP resume. ``save``: train N steps, ``dcp.save`` model, optimizer and compression state, train
    M more. ``resume``: fresh processes ``dcp.load`` them and train the same M steps. Both report the M
    losses and a digest of every rank's parameters and residuals (bitwise comparison in the test).
    ``load``: only ``dcp.load`` (at another world size: reports the error message)."""
    import torch.distributed.checkpoint as dcp
    k, me = dist.get_world_size(), dist.get_rank()
    first, more = int(extra.pop("n", 4)), int(extra.pop("m", 4))
    nodes = int(extra.pop("hsdp", 0))   # HSDP mode: FSDP2 over each of `nodes` groups, the codec across them
    width = int(extra.pop("width", 16))   # wide inputs: buckets large enough for the two-phase pattern
    net = build(nodes=nodes, width=width, interleave=bool(extra.pop("interleave", 0)))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.0 if codec_key == "dgc" else 0.9)
    name, codec_opts, reg_opts = CODECS[codec_key]
    codec_opts = {k_: v for k_, v in codec_opts.items() if k_ != "impl"}
    reg_opts = {"momentum": 0.9} if codec_key == "dgc" else reg_opts
    state = hgc.fsdp.register(net, name, optimizer=opt, **{**codec_opts, **reg_opts, **extra})
    assert state.mode == ("hsdp" if nodes else "sharded"), state
    everything = {"training": _Training(net, opt), "compression": state}
    data = list(batches(first + more, 32, seed=77 + me, width=width))

    def run(steps):
        out = []
        for x, y in steps:
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            out.append(loss.item())
        return out

    if phase == "load":
        try:
            dcp.load(everything, checkpoint_id=directory)
        except (Exception, dcp.api.CheckpointException) as e:  # noqa: BLE001 - the test reads the message
            message = str(e)
        else:
            message = None
        flags = torch.tensor([0.0 if message is None else 1.0])
        dist.all_reduce(flags)
        hgc.ddp.keep_until_exit(flags)
        return {"ok": True, "raised_on": int(flags.item()), "message": (message or "")[:2000]}
    if phase == "save":
        run(data[:first])
        dcp.save(everything, checkpoint_id=directory)
    else:
        dcp.load(everything, checkpoint_id=directory)
    losses = run(data[first:])
    h = hashlib.sha256()
    for p in net.parameters():
        h.update(p.to_local().detach().numpy().tobytes())
    compressions = [hook.compression for hook in state.hooks] if nodes else [state.compression]
    for c in compressions:
        memories = [(store, getattr(c.memory, store, {})) for store in ("residuals", "velocities", "accumulations")]
        for store, tensors in [*memories, ("owner", c.state.owner_memory.residuals)]:
            for key, t in sorted(tensors.items()):
                h.update(f"{store}:{key}".encode())
                h.update(t.float().numpy().tobytes())
    mine = torch.cat([torch.tensor(losses, dtype=torch.float64),
                      torch.frombuffer(bytearray(h.digest()), dtype=torch.uint8).double()])
    every = [torch.empty_like(mine) for _ in range(k)]
    dist.all_gather(every, mine)
    hgc.ddp.keep_until_exit(mine, *every)   # gloo's abort at exit: see horovod_gradcomp/ddp/gloo_exit.py
    return {"ok": True, "losses": [e[:len(losses)].tolist() for e in every],
            "digests": [bytes(e[len(losses):].to(torch.uint8).tolist()).hex() for e in every],
            "memory_bytes": state.stats()["memory_bytes"], "step": compressions[0].state.step,
            "owner_residuals": sum(len(c.state.owner_memory.residuals) for c in compressions)}


def errors() -> dict:
    """What register() refuses, each with a message naming the problem (every rank raises the same)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    k = dist.get_world_size()
    cases = {
        "unknown codec": (lambda: hgc.fsdp.register(build(), "nosuch"), ValueError, "unknown codec"),
        "refused option": (lambda: hgc.fsdp.register(build(), "onebit", pattern="two_phase"), ValueError,
                           "not taken here"),
        "no FSDPModule": (lambda: hgc.fsdp.register(Net(), "onebit"), ValueError, "call fully_shard"),
        "dgc clip_norm": (lambda: hgc.fsdp.register(build(), "dgc", momentum=0.0, clip_norm=1.0),
                          NotImplementedError, "clip_norm"),
        "residual_dtype without feedback": (
            lambda: hgc.fsdp.register(build(), "terngrad", residual_dtype=torch.bfloat16), ValueError,
            "needs error feedback"),
    }

    def shard1():
        net = Net()
        fully_shard(net, shard_placement_fn=lambda p: Shard(1) if p.dim() == 2 and p.shape[1] % k == 0 else None)
        hgc.fsdp.register(net, "onebit")
    cases["Shard(1)"] = (shard1, NotImplementedError, "Shard(1)")
    if k == 4:
        def hsdp():
            net = Net()
            fully_shard(net, mesh=init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard")))
            hgc.fsdp.register(net, "onebit")
        cases["2-D mesh"] = (hsdp, NotImplementedError, "2-D mesh")
    messages = {}
    for what, (fn, exc, words) in cases.items():
        try:
            fn()
        except exc as e:
            assert words in str(e), (what, str(e))
            messages[what] = str(e)[:200]
        else:
            raise AssertionError(f"{what}: no {exc.__name__}")
    return {"ok": True, "messages": messages}


def main() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.set_device(DEVICE.index or 0)
    dist.init_process_group(BACKEND)
    mode = sys.argv[1]
    if mode == "oracle":
        result = oracle(sys.argv[2], options(sys.argv[3:]))
    elif mode == "train":
        result = train(sys.argv[2], options(sys.argv[3:]))
    elif mode == "mismatch":
        result = mismatch()
    elif mode == "nonfinite":
        result = nonfinite()
    elif mode == "accumulate":
        result = accumulate()
    elif mode == "errors":
        result = errors()
    elif mode == "checkpoint":
        result = checkpoint(sys.argv[2], sys.argv[3], sys.argv[4], options(sys.argv[5:]))
    elif mode == "hsdp":
        result = hsdp(sys.argv[2], options(sys.argv[3:]))
    elif mode == "memory":
        result = memory(sys.argv[2], options(sys.argv[3:]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    if dist.get_rank() == 0:
        print(json.dumps(result), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
