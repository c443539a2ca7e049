"""``state = hgc.fsdp.register(model, codec, **options)``: the codecs inside FSDP2's reduce-scatter.

Call it on every rank after ``fully_shard`` (on the submodules, then the root). For every
``FSDPModule`` of ``model`` whose parameter group holds trainable parameters it sets a
:class:`~horovod_gradcomp.fsdp.comm.CompressedReduceScatter` (``set_custom_reduce_scatter``):
FSDP2 then hands that object the flat reduce-scatter input of the group (every rank's
dim-0-padded shards of every parameter, chunk by chunk) and each rank gets back the codec's
estimate of the mean (or sum) of its own shard: every rank encodes each segment of each chunk
through its memory, owner j receives and decodes the K payloads of chunk j and sums them in
float32 (:mod:`horovod_gradcomp.exchange.reduce_scatter`). The result is decoded once (no
requantization by the owner), and FSDP2's own pre- and post-divide factors, ``reduce_dtype``
and gradient copy-out are left as they are.

Modes. Sharded (the modules' 1-D mesh spans every rank): the compressed reduce-scatter above.
HSDP (the modules' 1-D mesh spans the ranks of one node, ``mesh=mesh_2d["shard"]``): FSDP2's dense
reduce-scatter inside the node, then the codec between nodes in the all-reduce hook
(:mod:`horovod_gradcomp.fsdp.hsdp`; residuals the size of the shard). ``mode="auto"`` picks the
one the layout says. A model sharded on a 2-D mesh (FSDP2's own HSDP, whose dense all-reduce runs
before the hook) is refused with a message saying how to shard instead.

Where the state lives and what it costs (sharded mode). The codec's options come from the same
factories as under Horovod and DDP (``hgc.Compression.<codec>``: error feedback on for onebit,
off for terngrad and qsgd; DGC's memory; the Adam-aware defaults). The worker memory is keyed by
segment, ``"<parameter>[<chunk>]"``, and every rank encodes all K chunks of every parameter, so:

* onebit's error-feedback residual (and terngrad's or qsgd's when ``error_feedback=True``) is one
  tensor per parameter and chunk, in the reduce dtype: **on every rank, as large as the unsharded
  padded gradient** (the full model's gradient in fp32 with the default reduce dtype: 4 bytes per
  parameter, K times the rank's shard), living on the gradients' device for the whole run;
* DGC's accumulation (and its velocity, when it has momentum) are the same size each, so twice
  the unsharded gradient with momentum;
* terngrad and qsgd (no error feedback by default) keep nothing.

``residual_dtype=torch.bfloat16`` stores the residuals in bf16: 2 bytes per parameter instead of 4.

This is the price of compressing before the reduce: each rank's residual must remember what it
failed to send of every chunk, not only its own. ``state.memory_bytes()`` reports it.

Steps. A step is one backward pass that reduce-scatters (gradient accumulation with
``set_requires_gradient_sync(False)`` calls nothing until the last micro-batch): it ends when
every registered module has reduced once, or when a module reduces a second time. FSDP2 is asked
to reduce-scatter unused parameters too (``set_reduce_scatter_unused_params(True)``, zeros for a
parameter that got no gradient), so that every call of a module has the same layout on every rank.

Agreement and non-finite values. Every call starts with the preamble collective
(:mod:`horovod_gradcomp.exchange.preamble`): ranks whose codec, options, memory, parameters or
step differ raise :class:`~horovod_gradcomp.errors.ExchangeMismatchError` on every
rank; when any rank's input holds a NaN or Inf, nothing is encoded (the memory is untouched) and
the reduced shard is NaN on every rank, as the DDP path does (a GradScaler or a finite check then
skips the step).

Stalls. A rank that stops taking part leaves the others waiting in a collective: each module's
compressed reduce-scatter (sharded) and replica exchange (HSDP) runs under the stall watchdog
(``timeout=`` seconds, else ``HOROVOD_GRADCOMP_STALL_TIMEOUT``, else 300; 0: none), which prints a
``StallError`` naming the module, the step and the ranks waited for, and ends the process
(:mod:`horovod_gradcomp.ddp.stall`; the launcher then ends the job). FSDP2's own collectives (the
parameter all-gathers, HSDP's dense reduce-scatter inside the node) are not guarded: their deadline
is the process group's ``timeout``.

``async_op=True`` (a caller of the reduce-scatter that asks for a work handle; FSDP2 in torch 2.13
never does): the reduce-scatter runs to its end inside the call and a completed ``Work`` is returned
(:mod:`horovod_gradcomp.fsdp.comm`, which cites FSDP2's call).

Checkpoints: both modes' states are ``torch.distributed.checkpoint`` ``Stateful`` objects, saved and
loaded by ``dcp.save`` / ``dcp.load`` with the model and the optimizer and resumed bitwise at the
same world size; another world size, or another split into nodes at the same world size (sharded
mode is one "node" of every rank), is refused on every rank with a message naming both (sharded:
:mod:`horovod_gradcomp.fsdp.checkpoint`; HSDP: :mod:`horovod_gradcomp.fsdp.hsdp_checkpoint`).
Nothing is unpickled.

DGC's momentum. In sharded mode one compression holds every parameter and takes an SGD's momentum
as under Horovod and DDP (``momentum=None``: at the optimizer's first ``step()``). In HSDP mode each
module has its own compression: with ``momentum=None`` one shared check hands the SGD's momentum to
all of them, at ``register`` when ``optimizer=`` is given, else at the optimizer's first ``step()``
(the SGD then runs with momentum 0); an explicit ``momentum=`` needs an SGD with momentum 0.

CPU offload (``fully_shard(..., offload_policy=CPUOffloadPolicy(...))``) is left as FSDP2 does it:
the codec works on the gradients where FSDP2 reduces them, and FSDP2 moves the reduced shard to the
CPU afterwards (tested on the CPU with ``pin_memory=False``).

Not yet: ``Shard(1)`` placements (refused with a message), DGC's ``clip_norm`` (it
needs the whole step's gradient norm before the first module reduces).
"""
from __future__ import annotations

import functools
from typing import Dict, Optional

import torch
import torch.distributed as dist

from ..codecs import available_codecs
from ..codecs.dgc import density_floor
from ..codecs.registry import codec_class
from ..ddp.gloo_exit import hold_backward_context
from ..ddp.stall import process_watchdog
from ..exchange.reduce_scatter import ShardLayout
from ..hvd_adapter.adam_defaults import AdamDefaultsGuard
from ..hvd_adapter.factories import Compression
from ..transports.torch_dist import TorchDistributedCommunicator
from ..state.low_precision_feedback import LowPrecisionErrorFeedback
from .hsdp import CountingHook, HSDPCompressionState, ReplicaAverage, replica_group, share_optimizer_momentum
from .state import FSDPCompressionState

#: Options of the Horovod/DDP factories that mean nothing here (FSDP2 decides the buckets: its
#: parameter groups; the pattern is the compressed reduce-scatter).
_REFUSED = ("pattern", "bucket_bytes", "overlap", "transport", "process_set", "pipeline_bytes", "ranks_per_node",
            "inner_pattern", "communicator")


def reduce_unused_params(module) -> None:
    """Ask FSDP2 to reduce-scatter the module's parameters that got no gradient too (zeros), so
    that every call has the layout :func:`register` built. Older PyTorch has no such switch (2.11
    has none, 2.13 has it): its FSDP2 leaves them out, and a step where one of them has no gradient then fails the
    layout check with a message naming the change (every parameter that gets a gradient in every
    step, the usual case, is unaffected)."""
    if hasattr(module, "set_reduce_scatter_unused_params"):   # (absent from PyTorch 2.11's FSDP2)
        module.set_reduce_scatter_unused_params(True, recurse=False)


def _fsdp_module_class():
    from torch.distributed.fsdp import FSDPModule
    return FSDPModule


def _groups(model: torch.nn.Module):
    """``(module name, module, param group)`` of every FSDPModule of ``model`` with a parameter group."""
    fsdp_module = _fsdp_module_class()
    found = []
    for name, module in model.named_modules():
        if isinstance(module, fsdp_module):
            group = module._get_fsdp_state()._fsdp_param_group
            if group is not None:
                found.append((name, module, group))
    return found


def _layout(name: str, group, names: Dict[int, str], owner: str) -> Optional[ShardLayout]:
    """The shard layout of one parameter group's trainable parameters (None when it has none)."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo
    params = [fp for fp in group.fsdp_params if fp.sharded_param.requires_grad]
    if not params:
        return None
    info = group.mesh_info
    if isinstance(info, HSDPMeshInfo):
        raise NotImplementedError(
            f"{owner}: module {name or '<root>'!r} is sharded on a 2-D mesh (FSDP2's own HSDP, whose replica "
            "all-reduce is dense and runs before the all-reduce hook). For the codec between nodes shard over the "
            "node's 1-D mesh instead (fully_shard(..., mesh=mesh_2d['shard'])): register() then finds the replicas "
            "and runs HSDP mode; or shard over a 1-D mesh of all ranks for the compressed reduce-scatter")
    if not isinstance(info, FSDPMeshInfo):
        raise ValueError(f"{owner}: module {name or '<root>'!r} is not sharded (mesh info {type(info).__name__})")
    shards = []
    for fp in params:
        pname = names.get(id(fp.sharded_param), getattr(fp, "_param_fqn", None))
        dim = getattr(getattr(fp, "fsdp_placement", None), "dim", 0)
        if dim != 0:
            raise NotImplementedError(f"{owner}: parameter {pname!r} is sharded on dim {dim} (Shard({dim})); the "
                                      "compressed reduce-scatter takes Shard(0) placements only for now")
        shards.append((pname, tuple(fp.padded_sharded_param_size)))
    return ShardLayout(shards, info.shard_mesh_size)


def register(model: torch.nn.Module, codec: str = "onebit", *, optimizer: Optional[torch.optim.Optimizer] = None,
             mode: str = "auto", check_agreement: bool = True, **options):
    """Compress the reduce-scatters of every ``FSDPModule`` in ``model`` with ``codec``; return the state.

    ``codec``: a name of ``hgc.available_codecs()``; ``options`` go to its factory
    (``hgc.Compression.<codec>``, e.g. ``error_feedback=``, ``bits=``, ``density=``, ``scales=``,
    ``warmup_steps=``). ``optimizer``: the optimizer that steps the parameters (the Adam family
    gets the codec's Adam defaults from the first step; without it, from its first ``step()``;
    DGC with ``momentum=None`` takes an SGD's momentum: at its first ``step()``; in HSDP mode at
    ``register`` when ``optimizer`` is given, see the module doc).
    ``residual_dtype`` (sharded mode, codecs with error feedback): store the error-feedback residual
    in ``torch.bfloat16`` or ``torch.float16`` (half of fp32's memory; the carried residual is
    rounded to it, :mod:`horovod_gradcomp.state.low_precision_feedback`); ``torch.float32``: the default.
    ``timeout``: the stall watchdog's deadline in seconds for each module's exchange (see the module
    doc; None: ``HOROVOD_GRADCOMP_STALL_TIMEOUT`` or 300, 0: none).
    ``check_agreement``: compare what the ranks exchange at every call (the preamble runs anyway
    for the non-finite flags). ``mode``: "sharded" (FSDP2 shards over every rank: the compressed
    reduce-scatter; returns a :class:`FSDPCompressionState`), "hsdp" (FSDP2 shards over the ranks
    of a node: its dense reduce-scatter there, the codec between nodes,
    :mod:`horovod_gradcomp.fsdp.hsdp`; returns an ``HSDPCompressionState``) or "auto" (the one the
    layout says: "hsdp" when the modules' 1-D mesh is smaller than the world). Call it on every rank,
    after ``fully_shard``, before the first backward (HSDP mode creates process groups); see the
    module doc for what works and what does not yet."""
    owner = f"hgc.fsdp.register({codec!r})"
    if codec not in available_codecs():
        raise ValueError(f"hgc.fsdp.register: unknown codec {codec!r}; available: {', '.join(available_codecs())} "
                         "(for FSDP2's own dense reduce-scatter, call nothing)")
    given = sorted(set(options) & set(_REFUSED))
    if given:
        raise ValueError(f"{owner}: {given} are not taken here: FSDP2's parameter groups are the buckets and the "
                         "pattern is the compressed reduce-scatter")
    if options.get("clip_norm") is not None:
        raise NotImplementedError(f"{owner}: DGC's clip_norm needs the whole step's gradient norm before the first "
                                  "module reduces, which FSDP2's module-by-module reduce-scatters do not give; "
                                  "clip after the reduce instead (clip_norm=None)")
    residual_dtype = options.pop("residual_dtype", None)
    groups = _groups(model)
    if not groups:
        raise ValueError(f"{owner}: {type(model).__name__} holds no FSDPModule: call fully_shard on it (and its "
                         "submodules) first")
    names = {id(p): n for n, p in model.named_parameters()}
    layouts = [(name, module, _layout(name, group, names, owner)) for name, module, group in groups]
    layouts = [(name, module, group_layout, group) for (name, module, group_layout), (_, _, group)
               in zip(layouts, groups) if group_layout is not None]
    if not layouts:
        raise ValueError(f"{owner}: no FSDPModule of {type(model).__name__} holds a trainable parameter")
    process_group = layouts[0][3].mesh_info.shard_process_group
    sizes = {lay.world_size for _, _, lay, _ in layouts}
    if len(sizes) != 1:
        raise NotImplementedError(f"{owner}: the modules are sharded over groups of different sizes {sorted(sizes)}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    factory = getattr(Compression, codec, None) or functools.partial(Compression.codec, codec)
    world, node = dist.get_world_size(), sizes.pop()
    if mode == "auto":
        mode = "hsdp" if node < world else "sharded"
    if mode not in ("sharded", "hsdp"):
        raise ValueError(f"{owner}: mode must be 'auto', 'sharded' or 'hsdp', got {mode!r}")
    if mode == "sharded" and node != world:
        raise ValueError(f"{owner}: mode='sharded' needs the modules sharded over all {world} ranks; they are sharded "
                         f"over {node} (use mode='hsdp' for the codec between the groups)")
    if residual_dtype is not None:
        _low_precision_memory(codec, residual_dtype, mode, options, owner)
    if mode == "hsdp":
        if node == world:
            raise ValueError(f"{owner}: mode='hsdp' needs the modules sharded over the ranks of one node (a 1-D mesh "
                             f"smaller than the world); they are sharded over all {world} ranks")
        return _register_hsdp(model, layouts, names, codec, factory, owner, optimizer, check_agreement,
                              world // node, options)
    communicator = TorchDistributedCommunicator(process_group)
    compression = factory(named, communicator=communicator, optimizer=optimizer, check_agreement=check_agreement,
                          **options)
    if optimizer is None:
        compression.adam_guard = AdamDefaultsGuard(compression, [p for _, p in named])
    state = FSDPCompressionState(compression, communicator)
    state.mesh = layouts[0][3].mesh_info.mesh
    state.nodes = [dist.get_process_group_ranks(process_group)]
    for name, module, group_layout, group in layouts:
        reduce_unused_params(module)
        module.set_custom_reduce_scatter(state.add_module(name, group_layout))
    hold_backward_context(model)   # PyTorch 2.13's abort at exit on gloo: see horovod_gradcomp/ddp/gloo_exit.py
    return state


def _low_precision_memory(codec, dtype, mode, options, owner) -> None:
    """Put the error-feedback memory of ``residual_dtype=dtype`` into ``options`` (sharded mode, a codec
    with error feedback; float32 is the default memory)."""
    if mode == "hsdp":
        raise ValueError(f"{owner}: residual_dtype is for sharded mode (there the residual is as large as the "
                         "unsharded gradient); in HSDP mode the residuals are the size of the shard")
    if codec == "dgc":
        raise NotImplementedError(f"{owner}: residual_dtype stores error-feedback residuals; DGC's velocities and "
                                  "accumulations are kept in the gradient's dtype")
    if "memory" in options:
        raise ValueError(f"{owner}: pass residual_dtype or memory, not both")
    if not options.get("error_feedback", codec_class(codec).error_feedback_default):
        raise ValueError(f"{owner}: residual_dtype={dtype} needs error feedback, which is off for {codec} "
                         "(pass error_feedback=True)")
    if dtype != torch.float32:
        options.pop("error_feedback", None)
        options["memory"] = LowPrecisionErrorFeedback(dtype)


def _register_hsdp(model, layouts, names, codec, factory, owner, optimizer, check_agreement, replicas, options):
    """HSDP mode (:mod:`horovod_gradcomp.fsdp.hsdp`): one compression per module over the replicas."""
    group, nodes = replica_group(layouts[0][3].mesh_info.shard_process_group, owner)
    communicator = TorchDistributedCommunicator(group)
    replicas_global = dist.get_process_group_ranks(group)
    hooks = []
    for name, module, layout, fsdp_group in layouts:
        params = [(names[id(fp.sharded_param)], fp.sharded_param) for fp in fsdp_group.fsdp_params
                  if fp.sharded_param.requires_grad]
        compression = factory(params, communicator=communicator, optimizer=optimizer,
                              check_agreement=check_agreement, **options)
        if optimizer is None:
            compression.adam_guard = AdamDefaultsGuard(compression, [p for _, p in params])
        # the stall watchdog ends this process (no MPI job to abort); its messages name the module and
        # the replicas' global ranks (the ranks they list are the replica group's)
        compression.engine.watchdog = process_watchdog()
        compression.engine.owner = (f"hgc.fsdp HSDP ({codec}, module {name or '<root>'!r}, replica group of global "
                                    f"ranks {replicas_global})")
        hooks.append(ReplicaAverage(compression, layout, name))
    trainable = [p for _, p in model.named_parameters() if p.requires_grad]
    if codec == "dgc":
        # each module's compression encodes its shard: the floor counts the values one rank encodes
        # per step over all modules (the model over the node's ranks), not each module's own
        per_rank = -(-sum(p.numel() for p in trainable) // layouts[0][2].world_size)
        for hook in hooks:
            hook.compression.memory.set_density_floor(density_floor(per_rank))
        if options.get("momentum") is None:
            share_optimizer_momentum([h.compression for h in hooks], trainable, optimizer, owner)
    if len(nodes) != replicas:
        raise ValueError(f"{owner}: HSDP needs the nodes' shard groups to split the {dist.get_world_size()} ranks "
                         f"into {replicas} nodes of {len(nodes[0])}; they are {nodes}")
    state = HSDPCompressionState(hooks, nodes, device_type=layouts[0][3].mesh_info.mesh.device_type)
    for (name, module, layout, fsdp_group), hook in zip(layouts, hooks):
        reduce_unused_params(module)
        module.set_all_reduce_hook(CountingHook(state, hook))
    hold_backward_context(model)
    return state
