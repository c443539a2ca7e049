#!/usr/bin/env bash
# The whole test suite: single-process tests and, from tests/test_mpi_suites.py, the MPI
# suites under mpirun -np 1, 2 and 4 (each launch under a timeout). Extra args go to pytest.
# First the test-time build of the OpenMP twin (ci/build_twin.sh; a no-op when up to date).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$HGC_ROOT"
bash ci/build_twin.sh
exec "$PY" -m pytest tests -q --color=no "$@"
