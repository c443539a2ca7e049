"""A worker's side of the sharded center: pull, push, staleness and push accounting.

Shared by the asynchronous schemes (asynchronous EASGD, Downpour, ADAG) by composition.
"""
from __future__ import annotations

import collections
from typing import Dict, Optional

import numpy as np
import torch

from ...flags import require_flag
from .base import Scheme
from .sharded_center import ShardedCenter
from .backoff_waits import barrier


class CenterClient:
    """Creates the sharded center from the scheme's (already broadcast) parameters.

    Fields:
        staleness: histogram {staleness: number of pushes} of this worker's pushes.
        pushed_sum: float64 sum of everything this worker's pushes added to the center
            (kept when ``track_pushes``; the accounting invariant of the tests uses it).
    """

    def __init__(self, scheme: Scheme, track_pushes: bool = False):
        require_flag(type(scheme).__name__, "track_pushes", track_pushes)
        self.scheme = scheme
        with scheme.guard("starting the center"):
            self.center = ShardedCenter(scheme, scheme.get_flat())
        self.staleness: Dict[int, int] = collections.Counter()
        self.pushed_sum: Optional[torch.Tensor] = (torch.zeros(scheme.numel, dtype=torch.float64)
                                                  if track_pushes else None)
        self.pulled_versions = np.zeros(scheme.size, dtype=np.int64)  # the start is a pull of version 0
        self._buf = torch.empty(scheme.numel, dtype=scheme.dtype)

    def pull(self) -> torch.Tensor:
        """The whole center (a new flat tensor); remembers the versions for staleness."""
        self.pulled_versions = self.center.pull(self._buf)
        return self._buf.clone()

    def push(self, delta: torch.Tensor) -> torch.Tensor:
        """Add ``delta`` to the center; returns what the center added (the decoded push)."""
        sent, staleness = self.center.push(delta, self.pulled_versions)
        self.staleness[staleness] += 1
        if self.pushed_sum is not None:
            self.pushed_sum += sent.to(torch.float64)
        return sent

    def finish(self) -> torch.Tensor:
        """Collective, after the worker's last push: wait for every worker's last push, pull
        the final center (the same on every rank), stop the service; returns the center."""
        barrier(self.scheme.comm)
        final = self.pull()
        self.center.close()
        return final

    def stats(self) -> Dict[str, object]:
        hist = dict(sorted(self.staleness.items()))
        n = sum(hist.values())
        out: Dict[str, object] = dict(self.center.served)
        out["staleness_histogram"] = hist
        out["staleness_mean"] = (sum(k * v for k, v in hist.items()) / n) if n else 0.0
        out["staleness_max"] = max(hist) if hist else 0
        return out

    def state_dict(self) -> Dict[str, object]:
        shard, version = self.center.shard_state()
        return {"shard": shard, "version": version, "rank": self.scheme.rank,
                "pulled_versions": self.pulled_versions.copy(), "staleness": dict(self.staleness)}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        if int(state["rank"]) != self.scheme.rank:
            raise ValueError(f"center checkpoint of rank {state['rank']} loaded on rank {self.scheme.rank}: "
                             "each rank must load its own checkpoint")
        self.center.load_shard(state["shard"].to(self.scheme.dtype), int(state["version"]))
        self.pulled_versions = np.asarray(state["pulled_versions"], dtype=np.int64).copy()
        self.staleness = collections.Counter(state["staleness"])
