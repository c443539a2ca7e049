"""ADAG: asynchronous distributed adaptive gradients (Hermans, 2017) against the sharded center."""
from __future__ import annotations

import torch

from .center_push_scheme import CenterPushScheme


class ADAG(CenterPushScheme):
    """Asynchronous, Downpour-like with a normalized accumulated update: after a
    communication window of ``window`` local steps the worker pushes
    ``(x - x_pulled) / window`` (the center adds it), then pulls the center and continues
    from it. The normalization keeps the center's step independent of the window size.
    ``finish()`` pushes a partial last window (also divided by ``window``) and leaves the
    final center on every rank.
    """

    name = "adag"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, window: int = 12,
                 track_pushes: bool = False, **kwargs):
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"adag: window must be an integer >= 1, got {window!r}")
        self.window = window
        super().__init__(model, optimizer, **kwargs)
        self._connect(track_pushes)

    def config_key(self) -> str:
        return f"{super().config_key()} window={self.window}"

    def _after_local_step(self) -> None:
        if self.local_steps % self.window == 0:
            self.client.push((self.get_flat() - self.ref) / self.window)
            self.ref = self.client.pull()
            self.set_flat(self.ref)

    def _finish(self) -> None:
        if self.local_steps % self.window != 0:
            self.client.push((self.get_flat() - self.ref) / self.window)
        self.set_flat(self.client.finish())
