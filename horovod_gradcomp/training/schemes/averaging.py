"""Synchronous model averaging: train locally, average the parameters every ``period`` steps."""
from __future__ import annotations

import torch

from .base import Scheme
from .collective import allgather_messages, allreduce_sum, broadcast_


class ModelAveraging(Scheme):
    """Every ``period`` local steps the ranks replace their parameters by the mean of all
    ranks' parameters (docs/schemes.md). With a codec, each rank sends its change
    since the last average, ``x_k - x_avg``, encoded (with error feedback), and every rank
    sets ``x = x_avg + mean_k decode(payload_k)``.

    ``finish()`` averages once more if local steps were taken since the last average and
    broadcasts rank 0's result, so every rank ends bitwise equal.
    """

    name = "model_averaging"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, period: int = 8, **kwargs):
        if not isinstance(period, int) or period < 1:
            raise ValueError(f"model_averaging: period must be an integer >= 1, got {period!r}")
        self.period = period
        super().__init__(model, optimizer, **kwargs)
        self.anchor = self.get_flat()  # the last average (reference of the encoded change)
        self._coder = self.range_coder(0, self.numel)

    def config_key(self) -> str:
        return f"{super().config_key()} period={self.period}"

    def _after_local_step(self) -> None:
        if self.local_steps % self.period == 0:
            self.average()

    def average(self) -> None:
        """Collective: every rank's parameters become the average (one exchange)."""
        x = self.get_flat()
        if self.codec is None:
            mean = allreduce_sum(self, x).div_(self.size)
        else:
            message, _ = self._coder.encode(x - self.anchor)
            total = torch.zeros(self.numel, dtype=torch.float64)
            for m in allgather_messages(self, message):
                total += self._coder.decode(m).to(torch.float64)
            mean = (self.anchor.to(torch.float64) + total / self.size).to(self.dtype)
        self.set_flat(mean)
        self.anchor = mean.clone()
        self.count("exchanges")

    def _finish(self) -> None:
        if self.local_steps % self.period != 0:
            self.average()
        final = broadcast_(self, self.get_flat())
        self.set_flat(final)

    def state_dict(self):
        state = super().state_dict()
        state["anchor"] = self.anchor.clone()
        return state

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.anchor = state["anchor"].to(self.dtype).clone()
