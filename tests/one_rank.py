"""A world of one rank for single-process exchanges: what the engine asks of a communicator
(``rank``, ``size``, ``thread_multiple``, the fixed- and variable-size allgathers), with the
only answer one rank can give: its own bytes. Test modules import it (``from one_rank import
OneRank``: pytest puts tests/ on ``sys.path``)."""
from __future__ import annotations

import torch


class OneRank:
    rank, size, thread_multiple = 0, 1, True

    def allgather(self, send: torch.Tensor) -> torch.Tensor:
        return send.reshape(1, -1).clone()

    def allgatherv(self, send: torch.Tensor) -> list:
        return [send.reshape(-1).clone()]
