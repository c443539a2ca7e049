#!/usr/bin/env bash
# Run a program under mpirun on a rate-limited network made of private namespaces:
#
#   ci/slownet.sh [--np K] [--burst 512kb] [--latency 100ms] [--timeout S] [--print-script] \
#                 MODE RATE -- PROGRAM [ARGS...]
#
# MODE loopback: all ranks share one tbf-limited lo; bridge: one namespace, veth and tbf per
# rank (a switch); with --per-node L, one namespace per node of L ranks (shared memory inside,
# limited veth links between nodes). RATE is tc's (1gbit, 100mbit). Example:
#   ci/slownet.sh --np 4 loopback 1gbit -- .venv/bin/python bench.py
# The namespaces, bridge and tbf are built by horovod_gradcomp/bench/slownet.py (one
# implementation; --print-script shows the bash it runs) and removed when the run ends.
# Needs root (or unprivileged user namespaces), unshare, and iproute2 (ci/install_system.sh).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
export PYTHONPATH="$HGC_ROOT${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m horovod_gradcomp.bench.slownet "$@"
