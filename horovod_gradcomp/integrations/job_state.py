"""Every rank's compression state in one object, for checkpoints written by rank 0 alone.

A compression's ``state_dict()`` holds one rank's state (error-feedback residuals, owner
stripes and DGC velocities differ between ranks). Lightning and Accelerate write a checkpoint
on rank 0 only and every rank reads the whole file back, so the job's state is gathered to
rank 0 over ``torch.distributed`` when saving, and each rank takes its own part when loading.
The layout is that of :func:`horovod_gradcomp.save_job_state`'s file:
``{"world_size": K, "ranks": [state of rank 0, ..., state of rank K-1]}``. The ranks' parts
travel in ``torch.save``'s format and are read back with ``torch.load(weights_only=True)``
(:mod:`horovod_gradcomp.state.checkpoint_data`): data, not code, like the checkpoint itself,
which Lightning and Accelerate read with ``weights_only=True`` by default.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from ..state.checkpoint_data import from_bytes, to_bytes


def _to_cpu(obj):
    """``obj`` with every tensor in it (through dicts, lists and tuples) moved to the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu()
    if isinstance(obj, dict):
        return {k: _to_cpu(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to_cpu(v) for v in obj)
    return obj


def gather_job_state(state, group=None) -> Optional[dict]:
    """Gather every rank's ``state.state_dict()`` (tensors moved to the CPU) to rank 0 of
    ``group`` (None: the default group). A collective: every rank of the group calls it.

    Returns ``{"world_size": K, "ranks": [...]}`` on rank 0 and None on the other ranks."""
    import torch.distributed as dist
    mine = _to_cpu(state.state_dict())
    if not (dist.is_available() and dist.is_initialized()):
        return {"world_size": 1, "ranks": [mine]}
    parts = _gather_bytes(to_bytes(mine).numpy().tobytes(), group)
    if parts is None:
        return None
    return {"world_size": len(parts),
            "ranks": [from_bytes(torch.frombuffer(bytearray(p), dtype=torch.uint8), f"gather_job_state: rank {r}'s part")
                      for r, p in enumerate(parts)]}


def _gather_bytes(data: bytes, group) -> Optional[List[bytes]]:
    """Every rank's ``data`` on rank 0 of ``group``, in rank order (None on the other ranks): an
    all_gather of the sizes and a gather of the padded bytes. Its tensors stay referenced from
    C++ until the next call (``hgc.ddp.hold_latest``): a save is often a job's last collective,
    and PyTorch 2.13 aborts a gloo job whose worker frees a Python-made tensor while the
    interpreter exits (horovod_gradcomp/ddp/gloo_exit.py)."""
    import torch.distributed as dist

    from ..ddp.gloo_exit import hold_latest
    k, rank = dist.get_world_size(group), dist.get_rank(group)
    size = torch.tensor([len(data)], dtype=torch.int64)
    sizes = [torch.empty_like(size) for _ in range(k)]
    dist.all_gather(sizes, size, group=group)
    counts = [int(s) for s in sizes]
    padded = torch.zeros(max(counts), dtype=torch.uint8)
    padded[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else padded[:0]
    every = [torch.empty_like(padded) for _ in range(k)] if rank == 0 else None
    dist.gather(padded, every, dst=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    hold_latest("gather_job_state", size, *sizes, padded, *(every or []))
    return [every[r][:counts[r]].numpy().tobytes() for r in range(k)] if rank == 0 else None


def rank_part(job: dict, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s state from a :func:`gather_job_state` result (or a ``save_job_state``
    file's contents). ``ValueError`` if the job had another number of ranks or the object is
    not such a result: residuals cannot be redistributed to another number of ranks."""
    if not isinstance(job, dict) or "world_size" not in job or "ranks" not in job:
        raise ValueError("hgc: this is not a job compression state ({'world_size': K, 'ranks': [...]}); "
                         f"got {type(job).__name__}" + (f" with keys {sorted(job)}" if isinstance(job, dict) else ""))
    if job["ranks"] is None:
        raise ValueError("hgc: this compression state was written by a process other than rank 0, which holds no "
                         "rank's state (save it from every rank, with rank 0's copy written to disk)")
    if job["world_size"] != world_size:
        raise ValueError(f"hgc: the checkpoint holds the compression state of {job['world_size']} ranks; this job has "
                         f"{world_size}. Residuals cannot be redistributed to another number of ranks: resume with "
                         f"{job['world_size']} ranks, or drop the compression state and start it fresh")
    return job["ranks"][rank]


class JobCompressionState:
    """A view of one rank's hook state (:class:`horovod_gradcomp.ddp.DDPCompressionState`, or
    anything with ``state_dict``/``load_state_dict`` whose state is per rank) whose
    ``state_dict()`` is the whole job's.

    ``state_dict()`` is a collective (every rank calls it; rank 0 gets the job's state, the
    others ``{"world_size": K, "ranks": None}``); ``load_state_dict(job)`` needs no
    communication: each rank loads its own part of the job's state.
    """

    def __init__(self, state, group=None):
        self.state = state
        self.group = group

    def _rank_size(self):
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(self.group), dist.get_world_size(self.group)
        return 0, 1

    def state_dict(self) -> dict:
        job = gather_job_state(self.state, self.group)
        return job if job is not None else {"world_size": self._rank_size()[1], "ranks": None}

    def load_state_dict(self, job: dict) -> None:
        rank, size = self._rank_size()
        self.state.load_state_dict(rank_part(job, rank, size))
