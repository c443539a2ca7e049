"""Where an exchange's bytes travel: the transports behind the communicator seam.

Every transport implements the interface of :class:`~horovod_gradcomp.exchange.communicator.MPICommunicator`
(``rank``, ``size``, ``allgather``, ``allgatherv``, ``alltoallv``, ``allgatherv_known``,
``allreduce_max``), so both patterns and every codec run unchanged on
each: mpi4py (:class:`~horovod_gradcomp.exchange.communicator.MPICommunicator`), Horovod's own collectives
(:class:`~.horovod_ops.HorovodCommunicator`) and torch.distributed
(:class:`~.torch_dist.TorchDistributedCommunicator`, for the DDP hook).
"""
from .select import TRANSPORTS, select_communicator

__all__ = ["TRANSPORTS", "select_communicator"]
