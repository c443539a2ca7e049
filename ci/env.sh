# Sourced by the ci/ scripts and the Makefile's recipes: one place for the knobs.
# Every value can be overridden from the environment.
HGC_ROOT="${HGC_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
VENV="${VENV:-$HGC_ROOT/.venv}"
PYTHON_BOOT="${PYTHON_BOOT:-python3}"
# The CPU wheel of this version is what these machines carry; an unpinned torch pulls GBs of CUDA.
TORCH_SPEC="${TORCH_SPEC:-torch==2.13.0}"
HOROVOD_VERSION="${HOROVOD_VERSION:-0.28.1}"
MPI4PY_SPEC="${MPI4PY_SPEC:-mpi4py==4.1.2}"
# Built Horovod wheels are kept here, keyed by Horovod and torch versions, so a fresh clone
# does not rebuild Horovod (3+ minutes) when the machine already built it once.
HGC_CACHE="${HGC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/horovod_gradcomp}"
PY="$VENV/bin/python"
# Open MPI refuses root unless told; with 2 cores, -np 4 needs oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# CCCL's headers (Thrust/CUB) for the OpenMP twin's test-time build, where no CUDA toolkit has them.
CCCL_SPEC="${CCCL_SPEC:-nvidia-cuda-cccl==13.0.*}"
