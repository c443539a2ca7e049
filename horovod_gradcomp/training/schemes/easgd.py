"""Elastic averaging SGD (Zhang, Choromanska, LeCun 2015), synchronous or asynchronous."""
from __future__ import annotations

import torch

from ...flags import require_flag
from .base import Scheme
from .client import CenterClient
from .collective import allgather_messages, allreduce_sum, broadcast_


class EASGD(Scheme):
    """Workers ``x_k`` and a center ``c``; every ``period`` local steps (docs/schemes.md):

    - synchronous: ``d_k = x_k - c``; ``x_k -= alpha d_k``; ``c += alpha sum_k d_k``
      (one collective; the center is replicated on every rank);
    - asynchronous: the worker alone, against the sharded center (no waiting for peers):
      pull ``c``, ``d = alpha (x_k - c)``, push ``d`` (the center adds it), ``x_k -= d``.

    With a codec, ``d_k`` (synchronous) or ``d`` (asynchronous) travels encoded with error
    feedback, and both the worker and the center apply the decoded value, so the sum
    ``c + sum_k x_k`` is conserved as in the exact method. ``finish()`` leaves the center
    on every rank. ``track_pushes`` (asynchronous) keeps the float64 sum of this worker's
    pushes (:attr:`pushed_sum`).
    """

    name = "easgd"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, period: int = 8,
                 alpha: float = 0.1, asynchronous: bool = False, track_pushes: bool = False, **kwargs):
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"easgd: period must be an integer >= 1, got {period!r}")
        if not 0.0 < float(alpha) <= 1.0:
            raise ValueError(f"easgd: alpha must be in (0, 1], got {alpha!r}")
        self.period, self.alpha = period, float(alpha)
        self.asynchronous = require_flag("easgd", "asynchronous", asynchronous)
        super().__init__(model, optimizer, **kwargs)
        if self.asynchronous:
            self.client = CenterClient(self, track_pushes)
            self.center = None
        else:
            self.client = None
            self.center = self.get_flat()  # replicated: every rank applies the same update
            self._coder = self.range_coder(0, self.numel)

    def config_key(self) -> str:
        return f"{super().config_key()} period={self.period} alpha={self.alpha} async={self.asynchronous}"

    @property
    def pushed_sum(self):
        return self.client.pushed_sum if self.client is not None else None

    def _after_local_step(self) -> None:
        if self.local_steps % self.period == 0:
            self.exchange()

    def exchange(self) -> None:
        """One elastic exchange (collective when synchronous)."""
        x = self.get_flat()
        if self.asynchronous:
            c = self.client.pull()
            sent = self.client.push(self.alpha * (x - c))
            self.set_flat(x - sent)
        else:
            d = x - self.center
            if self.codec is None:
                total = allreduce_sum(self, d)
            else:
                message, d = self._coder.encode(d)
                total = torch.zeros(self.numel, dtype=torch.float64)
                for m in allgather_messages(self, message):
                    total += self._coder.decode(m).to(torch.float64)
                total = total.to(self.dtype)
            self.set_flat(x - self.alpha * d)
            self.center += self.alpha * total
        self.count("exchanges")

    def _finish(self) -> None:
        if self.asynchronous:
            final = self.client.finish()
        else:
            final = broadcast_(self, self.center.clone())
            self.center = final.clone()
        self.set_flat(final)

    def stats(self):
        out = super().stats()
        if self.client is not None:
            out.update(self.client.stats())
        return out

    def state_dict(self):
        state = super().state_dict()
        state["center"] = self.client.state_dict() if self.client is not None else self.center.clone()
        return state

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        if self.client is not None:
            self.client.load_state_dict(state["center"])
        else:
            self.center = state["center"].to(self.dtype).clone()
