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
# A compiler cache shared by every clone on this machine: PyTorch's extension builder runs each
# compile (g++ and nvcc alike) under ccache when ccache is on PATH (ci/install_system.sh
# installs it), so the native builds (_C, the twin, the tests' sanitizer builds, the CUDA check's
# nvcc build) compile again only the translation units whose preprocessed text changed,
# whatever the clone's path or its files' times (ninja alone rebuilds everything in a fresh
# clone). Paths under $HGC_ROOT are hashed relative to it, so clones in different places share
# entries. HGC_CCACHE=0 turns it off (PyTorch's TORCH_NO_COMPILER_WRAPPER).
if [ "${HGC_CCACHE:-1}" = 0 ]; then
    export TORCH_NO_COMPILER_WRAPPER=1
elif command -v ccache >/dev/null 2>&1; then
    export CCACHE_DIR="${CCACHE_DIR:-$HGC_CACHE/ccache}" CCACHE_BASEDIR="${CCACHE_BASEDIR:-$HGC_ROOT}"
    export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}" CCACHE_MAXSIZE="${CCACHE_MAXSIZE:-8G}"
fi
# Open MPI refuses root unless told; with 2 cores, -np 4 needs oversubscription.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
# CCCL's headers (Thrust/CUB) for the OpenMP twin's test-time build, where no CUDA toolkit has them.
CCCL_SPEC="${CCCL_SPEC:-nvidia-cuda-cccl==13.0.*}"
# Horovod's own switches that ask its build for GPU operations (ci/build_horovod.sh builds without
# them otherwise); prints the ones set, as NAME=VALUE, nothing when none is.
horovod_gpu_asked() {
    local v
    for v in HOROVOD_GPU_OPERATIONS HOROVOD_GPU_ALLREDUCE HOROVOD_GPU_ALLGATHER HOROVOD_GPU_BROADCAST \
             HOROVOD_GPU_ALLTOALL; do
        [ -z "${!v:-}" ] || printf '%s=%s ' "$v" "${!v}"
    done
}
