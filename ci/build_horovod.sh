#!/usr/bin/env bash
# Builds a Horovod wheel (PyTorch with MPI and Gloo, no TensorFlow/MXNet) into the folder $1.
# Gloo (horovodrun --gloo, Horovod elastic) needs cmake: Debian's, from ci/install_system.sh.
# Horovod 0.28.1 predates two things on these machines, fixed here without patching its source:
#  - cmake >= 4 rejects its old cmake_minimum_required: CMAKE_POLICY_VERSION_MINIMUM=3.5;
#  - its CMake pins -std=c++14 for the torch module, torch 2.x headers need C++17 (C++20
#    from torch 2.14 on): a compiler wrapper rewrites the flag to what the torch needs.
# GPU operations only when asked. Horovod's CMake enables the CUDA language whenever it finds an
# nvcc (on PATH, or through a CUDA toolkit's bin directory), whether or not GPU operations were
# asked for, and an nvcc whose toolkit is incomplete stops the configure ("Couldn't find CUDA
# library root"). Unless one of Horovod's own switches asks for GPU operations
# (HOROVOD_GPU_OPERATIONS, HOROVOD_GPU_ALLREDUCE / _ALLGATHER / _BROADCAST / _ALLTOALL),
# CMake's configure is given no CUDA compiler and no CUDAToolkit package, so that any nvcc is ignored.
# A CUDA build of torch makes Horovod build its CUDA parts in any case (its FindPytorch): that
# needs a whole toolkit, and is left to Horovod.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
out="$1"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cxx_real=$(command -v "${CXX:-g++}")
std=$("$PY" -c "import torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); print('c++20' if v >= (2, 14) else 'c++17')")
cat > "$work/cxxstd" <<WRAP
#!/usr/bin/env bash
args=()
for a in "\$@"; do
    case "\$a" in -std=c++14|-std=gnu++14|-std=c++17|-std=gnu++17) a=-std=$std;; esac
    args+=("\$a")
done
exec "$cxx_real" "\${args[@]}"
WRAP
chmod +x "$work/cxxstd"
export CXX="$work/cxxstd" CMAKE_POLICY_VERSION_MINIMUM=3.5
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
       HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1
export MAKEFLAGS="-j$(nproc)" HOROVOD_BUILD_ARCH_FLAGS="${HOROVOD_BUILD_ARCH_FLAGS:-}"

if [ -n "$(horovod_gpu_asked)" ]; then
    echo "[ci/build_horovod] GPU operations asked for ($(horovod_gpu_asked)): Horovod's CMake looks for CUDA itself"
else
    # Horovod's setup.py runs "$HOROVOD_CMAKE SOURCE ARGS" (the configure), then "$HOROVOD_CMAKE --build ...".
    cmake_real=$(command -v cmake)
    cat > "$work/cmake" <<WRAP
#!/usr/bin/env bash
if [ "\${1:-}" != --build ]; then
    set -- "\$@" -DCMAKE_CUDA_COMPILER= -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
fi
exec "$cmake_real" "\$@"
WRAP
    chmod +x "$work/cmake"
    export HOROVOD_CMAKE="$work/cmake"
    unset HOROVOD_CUDA_HOME   # Horovod's CMake takes its nvcc as the CUDA compiler
    echo "[ci/build_horovod] building without GPU operations (any nvcc ignored; set HOROVOD_GPU_OPERATIONS=NCCL for them)"
fi
# --no-cache-dir: pip caches wheels built from an sdist by version only, blind to the
# HOROVOD_* switches above; a cached MPI-only build must not come back as this one.
"$PY" -m pip wheel -q --no-cache-dir --no-build-isolation --no-deps -w "$out" "horovod==$HOROVOD_VERSION"
