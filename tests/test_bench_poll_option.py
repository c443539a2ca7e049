"""``bench exchange``'s ``poll=SECONDS`` config option: the codec's communicator becomes the
polling one; a bad interval is refused."""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.bench import exchange_bench as eb
from horovod_gradcomp.transports.mpi_polling import PollingCommunicator


def test_poll_option_builds_a_polling_communicator():
    named = [("w", torch.nn.Parameter(torch.zeros(8, 4)))]
    comp, factory = eb.make_compression(eb.parse_config("onebit:poll=0.0005"), named)
    assert factory == "Compression.onebit" and isinstance(comp.communicator, PollingCommunicator)
    assert comp.communicator.interval_s == 0.0005
    for bad in ("onebit:poll=0", "onebit:poll=fast"):
        with pytest.raises(ValueError, match="poll=SECONDS"):
            eb.make_compression(eb.parse_config(bad), named)
