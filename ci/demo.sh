#!/usr/bin/env bash
# make demo: examples/train.py under mpirun with `none` and `onebit`, side by side.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$HGC_ROOT"
PY="$PY" exec bash examples/demo.sh "$@"
