"""What the twin's test modules (tests/test_device_qsgd.py, tests/test_device_terngrad.py) share:
the dtype and thread-count axes, the ids of dtype parameters, the ``twin`` and ``threads``
fixtures, and the count of device algorithm calls of one op. The modules import them
(``from device_helpers import ...``: pytest puts tests/ on ``sys.path``, as for
tests/launchers.py); a fixture a module imports is one of its fixtures.
"""
from __future__ import annotations

import pytest
import torch

from horovod_gradcomp.native import require_twin

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
THREADS = [1, 2, 4]


def dtype_id(x):
    return str(x).replace("torch.", "")


@pytest.fixture(scope="module")
def twin():
    return require_twin()


@pytest.fixture(scope="module")
def D():
    """The twin with its DGC ops; fails (naming the codecs it has) when they are missing."""
    twin = require_twin()
    if "dgc" not in twin.codecs:
        pytest.fail(f"the twin holds no DGC ops (codecs: {twin.codecs})")
    return twin


@pytest.fixture
def threads():
    """Runs the body at a given thread count and restores the count afterwards."""
    saved = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(saved)


def device_calls(twin, fn):
    """The number of device algorithm calls ``fn()`` makes on the twin."""
    before = twin.algorithm_calls()
    fn()
    return twin.algorithm_calls() - before


def outcome(fn, *args):
    """``(exception type, first line of its message)`` of ``fn(*args)``, or ``(None, "returned")``:
    what a refusal looks like, to compare the twin's with the CPU kernels'."""
    try:
        fn(*args)
    except (RuntimeError, ValueError, TypeError) as e:
        return type(e), str(e).splitlines()[0]
    return None, "returned"
