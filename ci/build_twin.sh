#!/usr/bin/env bash
# The test-time build of horovod_gradcomp._C_twin (the device sources built by g++ with Thrust's
# OpenMP backend; tests/test_cuda_codecs.py, tests/test_device_*.py), in place, when it is
# missing, does not load, or a native source is newer than it. CCCL's headers come from the CUDA
# toolkit, else from the nvidia-cuda-cccl wheel (installed here when neither has them, as
# ci/install_python.sh does). ninja keeps the objects in build/: a rebuild recompiles only the
# twin sources whose inputs changed. Prints what it did and how long it took.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
log() { echo "[ci/build_twin] $*"; }
cd "$HGC_ROOT"
start=$(date +%s)

cccl=$("$PY" -c "import setup; print(setup.cccl_include() or '')")
if [ -z "$cccl" ]; then
    log "no CUDA toolkit with CCCL: installing $CCCL_SPEC"
    "$PY" -m pip install -q "$CCCL_SPEC"
    cccl=$("$PY" -c "import setup; print(setup.cccl_include() or '')")
    [ -n "$cccl" ] || { log "CCCL's headers still not found after installing $CCCL_SPEC" >&2; exit 1; }
fi

so=$(ls horovod_gradcomp/_C_twin.*so 2>/dev/null | head -1 || true)
if [ -n "$so" ] && [ -z "$(find csrc setup.py -newer "$so" -type f 2>/dev/null | head -1)" ] \
   && "$PY" -c "import horovod_gradcomp.native as n, sys; sys.exit(0 if n.twin_available() else 1)" 2>/dev/null; then
    log "up to date: $so"
    exit 0
fi
log "building horovod_gradcomp._C_twin with CCCL from $cccl (MAX_JOBS=${MAX_JOBS:-$(nproc)})"
# --force: setuptools alone compares only the listed csrc/twin/*.cpp, not the device sources they include.
# --build-lib build/twin-lib: not build/lib.*, which a wheel built from this tree packs (the twin is no
# part of an install). PATH: the venv's ninja, for machines without a system one.
PATH="$VENV/bin:$PATH" HGC_WITH_TWIN=only MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
    "$PY" setup.py -q build_ext --inplace --force --build-lib build/twin-lib
"$PY" -c "from horovod_gradcomp.native import require_twin; print('[ci/build_twin] loaded', require_twin().__file__)"
log "built in $(( $(date +%s) - start ))s"
