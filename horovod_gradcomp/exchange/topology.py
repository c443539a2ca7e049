"""Which ranks share a node: the layout of the hierarchical exchange, and its two sub-communicators.

Where the layout comes from, first match wins:

1. ``ranks_per_node=L`` (the factories' and the DDP hook's option), else the environment variable
   ``HOROVOD_GRADCOMP_RANKS_PER_NODE``: nodes are consecutive blocks of L ranks (rank r is on
   node r // L, local rank r % L); with K not a multiple of L the last node is smaller (an
   unequal layout). This is how tests lay 2 nodes x 2 ranks on one host. No collective.
2. An mpi4py communicator: ``Split_type(COMM_TYPE_SHARED)`` (the ranks that share memory, i.e.
   one host as the MPI launcher sees it), then one allgather of (node, local rank) over the
   communicator, so every rank knows every node's size.
3. Any other communicator (torch.distributed under torchrun, Lightning, Accelerate):
   ``LOCAL_RANK`` (a node's ranks are consecutive: node key ``rank - LOCAL_RANK``), else the
   host name; then the same allgather.

Nodes are numbered by their lowest rank; within a node, ranks by local rank. The layout is
*equal* when every node has the same number of ranks L; only then is the hierarchical exchange
defined (local rank l of every node exchanges shard l). :func:`require_equal` raises an error
naming the node sizes otherwise; ``pattern="auto"`` falls back to the flat exchange instead.

Sub-communicators (:func:`sub_communicators`): ``node`` (this node's ranks, ordered by local
rank) and ``peers`` (the ranks with this rank's local rank, one per node, ordered by node), made
by the transport's ``split``
(:class:`~horovod_gradcomp.transports.interface.SplittableCommunicator`): ``MPI_Comm_split`` of an
mpi4py communicator, or ``torch.distributed.new_group`` for every node and every local rank (every
rank creates all of them, in the same order). Horovod's own collectives (``transport="horovod"``)
have no sub-groups here: refused with a message.
"""
from __future__ import annotations

import os
import socket
import zlib
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

from ..transports.interface import NodeAwareCommunicator, SplittableCommunicator
from .env import RANKS_PER_NODE_ENV, positive_int_from_env


@dataclass(frozen=True)
class Layout:
    """The nodes of a job of K ranks, seen from rank ``rank``.

    Fields: nodes (the ranks of each node, in local-rank order; nodes ordered by their lowest
    rank), rank (this rank), source (where it came from: "option", "environment", "mpi",
    "LOCAL_RANK" or "hostname")."""
    nodes: Tuple[Tuple[int, ...], ...]
    rank: int
    source: str

    @property
    def node_sizes(self) -> List[int]:
        return [len(n) for n in self.nodes]

    @property
    def equal(self) -> bool:
        """True when every node has the same number of ranks."""
        return len(set(self.node_sizes)) == 1

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def ranks_per_node(self) -> int:
        """L (the first node's size; the same for every node when :attr:`equal`)."""
        return len(self.nodes[0])

    @property
    def node(self) -> int:
        """This rank's node index."""
        return next(i for i, ranks in enumerate(self.nodes) if self.rank in ranks)

    @property
    def local_rank(self) -> int:
        return self.nodes[self.node].index(self.rank)

    @property
    def multi_level(self) -> bool:
        """True when the layout has more than one node and more than one rank per node, nodes
        equal: where ``pattern="auto"`` picks the hierarchical exchange."""
        return self.equal and self.num_nodes > 1 and self.ranks_per_node > 1

    def describe(self) -> str:
        """E.g. ``"2 nodes x 2 ranks"`` or ``"2 nodes of [2, 1] ranks"``."""
        if self.equal:
            return f"{self.num_nodes} nodes x {self.ranks_per_node} ranks"
        return f"{self.num_nodes} nodes of {self.node_sizes} ranks"

    def key(self) -> List[List[int]]:
        """The layout as plain lists (what a checkpoint records and a resume compares)."""
        return [list(n) for n in self.nodes]


def ranks_per_node_setting(option: Optional[int], owner: str = "hierarchical exchange") -> Optional[int]:
    """The explicit ranks per node: ``option`` when given (an int >= 1, ValueError otherwise),
    else ``HOROVOD_GRADCOMP_RANKS_PER_NODE``, else None (ask the launcher)."""
    if option is not None:
        if isinstance(option, bool) or not isinstance(option, int) or option < 1:
            raise ValueError(f"{owner}: ranks_per_node must be a positive int or None, got {option!r}")
        return option
    return positive_int_from_env(RANKS_PER_NODE_ENV)


def block_layout(k: int, ranks_per_node: int, rank: int, source: str = "option") -> Layout:
    """Consecutive blocks of ``ranks_per_node`` ranks (the last one smaller when it does not divide K)."""
    nodes = tuple(tuple(range(s, min(s + ranks_per_node, k))) for s in range(0, k, ranks_per_node))
    return Layout(nodes, rank, source)


def launcher_hint(k: int) -> bool:
    """True when the launcher's own environment says the job may span several nodes (a node's
    rank count below K: ``OMPI_COMM_WORLD_LOCAL_SIZE``, ``LOCAL_WORLD_SIZE``, ``MPI_LOCALNRANKS``).
    The same on every rank of a job (with one node every rank sees K; with several, every rank
    sees fewer), so ``pattern="auto"`` may decide from it whether to look for nodes at all."""
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", "MPI_LOCALNRANKS"):
        raw = os.environ.get(var, "").strip()
        if raw.isdigit():
            return 0 < int(raw) < k
    return False


def discover_layout(comm, ranks_per_node: Optional[int] = None, owner: str = "hierarchical exchange") -> Layout:
    """This job's :class:`Layout` (see the module doc for the order of sources). Without an
    explicit ``ranks_per_node`` it runs collectives on ``comm`` (every rank must call it at the
    same point)."""
    k, rank = comm.size, comm.rank
    explicit = ranks_per_node_setting(ranks_per_node, owner)
    if explicit is not None:
        return block_layout(k, explicit, rank, "option" if ranks_per_node is not None else "environment")
    if k == 1:
        return Layout(((0,),), 0, "single rank")
    key, local, source = _node_identity(comm)
    mine = torch.from_numpy(np.array([key, local], dtype=np.int64).view(np.uint8).copy())
    every = comm.allgather(mine).cpu().numpy().reshape(k, -1).view(np.int64)
    return layout_from_identities([(int(a), int(b)) for a, b in every], rank, source)


def layout_from_identities(identities: Sequence[Tuple[int, int]], rank: int, source: str) -> Layout:
    """The layout from every rank's (node key, local rank): ranks of one key form a node."""
    groups = {}
    for r, (key, local) in enumerate(identities):
        groups.setdefault(key, []).append((local, r))
    nodes = sorted((tuple(r for _, r in sorted(members)) for members in groups.values()), key=min)
    return Layout(tuple(nodes), rank, source)


def _node_identity(comm) -> Tuple[int, int, str]:
    """(node key, local rank, source) of this rank (see the module doc)."""
    transport = _recorded(comm)
    if isinstance(transport, NodeAwareCommunicator):
        key, local = transport.node_identity()
        return key, local, "mpi"
    local = os.environ.get("LOCAL_RANK", "").strip()
    if local.isdigit():
        return comm.rank - int(local), int(local), "LOCAL_RANK"
    return zlib.crc32(socket.gethostname().encode()), comm.rank, "hostname"


def _recorded(comm):
    """``comm`` itself, or the communicator under a recording wrapper (the breakdown's
    :class:`~horovod_gradcomp.exchange.timeline.TimedCommunicator`)."""
    return getattr(comm, "recorded_communicator", comm)


def require_equal(layout: Layout, owner: str) -> None:
    """Raise ValueError naming the node sizes unless every node has the same number of ranks."""
    if not layout.equal:
        raise ValueError(
            f"{owner}: pattern='hierarchical' needs nodes of equal size, but this job's {sum(layout.node_sizes)} ranks "
            f"form {layout.num_nodes} nodes of {layout.node_sizes} ranks (from {layout.source}); use a flat pattern "
            "('allgather', 'two_phase' or 'auto', which falls back to flat here), or set ranks_per_node "
            f"(or {RANKS_PER_NODE_ENV}) to a divisor of the world size")


def can_split(comm) -> bool:
    """True when :func:`sub_communicators` can split ``comm``: its transport is a
    :class:`~horovod_gradcomp.transports.interface.SplittableCommunicator` (mpi4py, torch.distributed)."""
    return isinstance(_recorded(comm), SplittableCommunicator)


def sub_communicators(comm, layout: Layout, owner: str = "hierarchical exchange"):
    """``(node, peers)`` communicators of this rank (see the module doc): the transport's
    ``split`` into the nodes, then into the groups of equal local rank. Collective on ``comm``.
    Those of a recorded communicator are recorded on the same timeline."""
    require_equal(layout, owner)
    base = _recorded(comm)
    if base is not comm:
        return tuple(comm.record(c) for c in sub_communicators(base, layout, owner))
    if not can_split(comm):
        raise TypeError(f"{owner}: pattern='hierarchical' needs an mpi4py or torch.distributed communicator to split "
                        f"into nodes, got {comm!r} (Horovod's own collectives, transport='horovod', have no sub-groups "
                        "here: use transport='mpi')")
    peer_groups = [[node[local] for node in layout.nodes] for local in range(layout.ranks_per_node)]
    return comm.split(layout.nodes), comm.split(peer_groups)


__all__ = ["Layout", "block_layout", "can_split", "discover_layout", "launcher_hint", "layout_from_identities",
           "ranks_per_node_setting", "require_equal", "sub_communicators"]
