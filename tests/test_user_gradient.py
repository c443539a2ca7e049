"""Issue 30's Horovod suites launched alone at -np 2 (they also run in tests/test_mpi_suites.py at
1-4): the gradient-clipping scenario and synchronize() against the codec's own decode, every
codec at its defaults (tests/mpi/mpi_no_rescaling.py); every codec with Adam and AdamW
(tests/mpi/mpi_adam.py)."""
from __future__ import annotations

import re

import pytest

from launchers import mpirun, run

TIMEOUT_S = 300


@pytest.mark.timeout(TIMEOUT_S + 60)
def test_no_rescaling_and_adam_suites_at_two_ranks():
    proc = run(mpirun(2, "-m", "pytest", "-x", "-q", "--color=no", "-p", "no:cacheprovider", "-o",
                      "python_files=mpi_*.py", "tests/mpi/mpi_no_rescaling.py", "tests/mpi/mpi_adam.py"), TIMEOUT_S)
    out = proc.stdout + proc.stderr
    summaries = re.findall(r"\d+ (?:passed|failed|skipped|error)[\w, ]* in [\d.]+s", out)
    assert len(summaries) == 2 and all("passed" in s and "failed" not in s and "skipped" not in s
                                       for s in summaries), summaries
