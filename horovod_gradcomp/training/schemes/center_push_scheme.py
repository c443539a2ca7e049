"""What Downpour and ADAG share: a client of the sharded center and the point of the next push."""
from __future__ import annotations

from .base import Scheme
from .client import CenterClient


class CenterPushScheme(Scheme):
    """Base of the schemes that push parameter changes to the sharded center and pull it back.

    Fields (set by :meth:`_connect`, after ``Scheme.__init__``):
        client: the :class:`~horovod_gradcomp.training.schemes.client.CenterClient`.
        ref: the flat parameters the next push is measured from (the last pull or push point).
    ``stats()`` and checkpoints include the client's and ``ref``.
    """

    def _connect(self, track_pushes: bool) -> None:
        self.client = CenterClient(self, track_pushes)
        self.ref = self.get_flat()

    @property
    def pushed_sum(self):
        return self.client.pushed_sum

    def stats(self):
        out = super().stats()
        out.update(self.client.stats())
        return out

    def state_dict(self):
        state = super().state_dict()
        state.update(center=self.client.state_dict(), ref=self.ref.clone())
        return state

    def load_state_dict(self, state) -> None:
        super().load_state_dict(state)
        self.client.load_state_dict(state["center"])
        self.ref = state["ref"].to(self.dtype).clone()
