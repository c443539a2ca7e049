"""Where an exchange's bytes travel: the transports, side by side behind one interface.

Every transport implements :class:`~.interface.Communicator` (``rank``, ``size``, ``allgather``,
``allgatherv``, ``alltoallv``, ``allgatherv_known``, ``allreduce_max``), so every exchange
pattern and every codec runs unchanged on each:

* mpi4py: :class:`~.mpi.MPICommunicator` (:mod:`.mpi`), its waiting-by-polling variant
  :class:`~.mpi_polling.PollingCommunicator` (:mod:`.mpi_polling`), and who initializes and finalizes MPI (:mod:`.mpi_lifetime`);
* Horovod's own collectives: :class:`~.horovod_ops.HorovodCommunicator` (:mod:`.horovod_ops`);
* torch.distributed: :class:`~.torch_dist.TorchDistributedCommunicator` (:mod:`.torch_dist`, for
  the DDP hook; also an :class:`~.interface.AsyncCommunicator`).

The argument checks they share are in :mod:`.checks`; which one a compression gets is
:func:`~.select.select_communicator`'s rule. Nothing here imports the exchange: the layers above
(``exchange/``, ``ddp/``, ``hvd_adapter/``) import the transports, never the reverse.
"""
from .interface import AsyncCommunicator, Communicator, SplittableCommunicator
from .mpi import MPICommunicator, default_communicator
from .mpi_polling import PollingCommunicator
from .select import TRANSPORTS, select_communicator

__all__ = ["AsyncCommunicator", "Communicator", "MPICommunicator", "PollingCommunicator", "SplittableCommunicator",
           "TRANSPORTS", "default_communicator", "select_communicator"]
