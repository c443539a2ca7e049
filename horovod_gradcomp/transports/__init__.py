"""Where an exchange's bytes travel: mpi4py (:mod:`.mpi`, :mod:`.mpi_polling`, :mod:`.mpi_lifetime`),
Horovod's own collectives (:mod:`.horovod_ops`) and torch.distributed (:mod:`.torch_dist`), side by
side behind one interface (:mod:`.interface`), with the argument checks they share (:mod:`.checks`)
and the rule that picks one (:mod:`.select`). Nothing here imports the layers above.
"""
from .interface import AsyncCommunicator, Communicator, SplittableCommunicator
from .mpi import MPICommunicator, default_communicator
from .mpi_polling import PollingCommunicator
from .select import TRANSPORTS, select_communicator

__all__ = ["AsyncCommunicator", "Communicator", "MPICommunicator", "PollingCommunicator", "SplittableCommunicator",
           "TRANSPORTS", "default_communicator", "select_communicator"]
