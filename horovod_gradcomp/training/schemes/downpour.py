"""Downpour SGD (Dean et al., NIPS 2012) against the sharded center."""
from __future__ import annotations

import torch

from .center_push_scheme import CenterPushScheme


class Downpour(CenterPushScheme):
    """Asynchronous: every ``push_every`` local steps the worker pushes its accumulated
    update since the last push or fetch, ``x - x_ref`` (the center adds it as is), and
    every ``fetch_every`` steps it replaces its parameters by a fresh pull of the center.
    Progress made since the last push is dropped by a fetch (choose ``fetch_every`` a
    multiple of ``push_every`` to avoid that). Works with any local optimizer: the pushed
    update is the change of the parameters, whatever produced it.
    ``finish()`` pushes what is pending and leaves the final center on every rank.
    """

    name = "downpour"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, push_every: int = 4,
                 fetch_every: int = 4, track_pushes: bool = False, **kwargs):
        for what, v in (("push_every", push_every), ("fetch_every", fetch_every)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"downpour: {what} must be an integer >= 1, got {v!r}")
        self.push_every, self.fetch_every = push_every, fetch_every
        super().__init__(model, optimizer, **kwargs)
        self._connect(track_pushes)

    def config_key(self) -> str:
        return f"{super().config_key()} push_every={self.push_every} fetch_every={self.fetch_every}"

    def _after_local_step(self) -> None:
        t = self.local_steps
        if t % self.push_every == 0:
            x = self.get_flat()
            self.client.push(x - self.ref)
            self.ref = x
        if t % self.fetch_every == 0:
            c = self.client.pull()
            self.set_flat(c)
            self.ref = c

    def _finish(self) -> None:
        if self.local_steps % self.push_every != 0:
            self.client.push(self.get_flat() - self.ref)
        self.set_flat(self.client.finish())
