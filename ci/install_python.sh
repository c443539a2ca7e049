#!/usr/bin/env bash
# Creates $VENV and installs, idempotently: torch (pinned, overridable by TORCH_SPEC),
# mpi4py, Horovod built with PyTorch + MPI + Gloo, the example dependencies, the test and docs
# tools (unless HGC_INSTALL_EXTRAS=0, as `make demo` sets), CCCL's
# headers (the nvidia-cuda-cccl wheel, only where no CUDA toolkit has them: the twin's
# test-time build, ci/build_twin.sh, needs them) and horovod_gradcomp itself: registered
# editable without compiling, then its native extension _C built once, in place, by ninja
# (objects kept in build/: a later source change recompiles only what it touches).
# The OpenMP twin _C_twin is not built here: `make test` builds it (ci/build_twin.sh).
# Prints how long each phase took.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
log() { echo "[ci/install_python] $*"; }
t_all=$(date +%s); t_phase=$t_all; phases=()
phase() {  # phase NAME: closes the running phase under NAME, with its seconds
    local now; now=$(date +%s); phases+=("$1 $((now - t_phase))s"); t_phase=$now
}

[ -x "$PY" ] || { log "creating $VENV"; "$PYTHON_BOOT" -m venv "$VENV"; }
pipi() { "$PY" -m pip install -q "$@"; }
phase venv

if ! "$PY" -c "import torch" 2>/dev/null; then
    log "installing $TORCH_SPEC"; pipi "$TORCH_SPEC"
fi
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")
phase torch

# What building _C needs; then _C's build starts in the background (below), beside the other installs.
pipi "setuptools>=68" wheel ninja packaging
phase build_tools

# _C: (re)built when it does not load, when a native source is newer than the built module, or when
# HGC_REBUILD is set; in place, by ninja (objects kept in build/). --force: setuptools alone compares
# only the listed .cpp files, not the headers they include; ninja recompiles only what changed.
so=$(ls "$HGC_ROOT"/horovod_gradcomp/_C.*so 2>/dev/null | head -1 || true)
build_pid=""
if [ -z "$so" ] || [ -n "${HGC_REBUILD:-}" ] \
   || [ -n "$(find "$HGC_ROOT/csrc" "$HGC_ROOT/setup.py" -newer "$so" -type f 2>/dev/null | head -1)" ] \
   || ! (cd "$HGC_ROOT" && "$PY" -c "from horovod_gradcomp import _C") >/dev/null 2>&1; then
    build_log=$(mktemp /tmp/hgc-build-C.XXXXXX.log)
    log "building the native extension horovod_gradcomp._C in the background (MAX_JOBS=${MAX_JOBS:-$(nproc)}, log $build_log)"
    # PATH: the venv's ninja (pip's), for machines without a system ninja; without one torch compiles
    # file by file, and nothing incrementally. set -m: the build runs in a process group of its own
    # (its id is build_pid), so that stop_build ends setup.py, ninja and every compiler under them.
    set -m
    (cd "$HGC_ROOT" && PATH="$VENV/bin:$PATH" HGC_WITH_TWIN=0 MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "$PY" setup.py -q build_ext --inplace --force) \
        </dev/null >"$build_log" 2>&1 &
    build_pid=$!
    set +m
fi
# Any exit before the build was waited for (a failed step, set -e, Ctrl-C, a kill) stops the build.
stop_build() {
    if [ -n "$build_pid" ]; then
        log "stopping the background build of horovod_gradcomp._C (process group $build_pid)"
        kill -TERM -- "-$build_pid" 2>/dev/null || true
        build_pid=""
    fi
}
trap stop_build EXIT
trap 'stop_build; exit 130' INT
trap 'stop_build; exit 143' TERM HUP

# Runtime and example dependencies (cheap when present: pip only checks); Horovod's own are here too.
pipi numpy "$MPI4PY_SPEC" scikit-learn tqdm psutil pyyaml cloudpickle cffi
# The test tools, the launchers DDP users come from (tests of the comm hook under each) and the docs
# site's tools; HGC_INSTALL_EXTRAS=0 (make demo) leaves them out: `make test` / `make docs` install them.
if [ "${HGC_INSTALL_EXTRAS:-1}" != 0 ]; then
    pipi pytest pytest-timeout matplotlib lightning accelerate mkdocs mkdocs-material "mkdocstrings[python]"
fi
phase dependencies

horovod_ok() {
    "$PY" - <<'PY' 2>/dev/null
import horovod, horovod.torch as hvd
from horovod.common.util import mpi_built
assert horovod.__version__ == __import__("os").environ["HOROVOD_VERSION"]
assert hvd.mpi_built(), "Horovod lacks MPI"
assert hvd.gloo_built(), "Horovod lacks Gloo"
PY
}
export HOROVOD_VERSION
if ! horovod_ok; then
    # "-mpi-gloo": wheels from before Gloo was built in (MPI only) are not reused.
    # A build asked for GPU operations (ci/build_horovod.sh) is kept apart, named by its switches.
    gpu_key=$(echo $(horovod_gpu_asked) | tr ' =' '+-')
    wheel_dir="$HGC_CACHE/wheels/horovod-$HOROVOD_VERSION-mpi-gloo${gpu_key:+-gpu-$gpu_key}-torch-$TORCH_VERSION"
    if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
        log "building Horovod $HOROVOD_VERSION against torch $TORCH_VERSION (takes a few minutes)"
        mkdir -p "$wheel_dir"
        "$(dirname "${BASH_SOURCE[0]}")/build_horovod.sh" "$wheel_dir"
    fi
    log "installing Horovod from $wheel_dir"
    pipi --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
    horovod_ok || { log "Horovod installed but lacks MPI or Gloo"; exit 1; }
fi

phase horovod

# CCCL's headers for the twin (ci/build_twin.sh): the CUDA toolkit's when it has them, else the wheel's.
if [ -z "$(cd "$HGC_ROOT" && "$PY" -c "import setup; print(setup.cccl_include() or '')")" ]; then
    log "no CUDA toolkit with CCCL: installing $CCCL_SPEC (headers for the twin's test-time build)"
    pipi "$CCCL_SPEC"
fi
phase cccl

# horovod_gradcomp itself, editable: registered once with no extension compiled (HGC_WITH_NATIVE=0),
# so that the only compile is the in-place build below.
if ! (cd / && "$PY" - "$HGC_ROOT" <<'PY') 2>/dev/null
import importlib.util, os, sys
spec = importlib.util.find_spec("horovod_gradcomp")
sys.exit(0 if spec and os.path.dirname(os.path.dirname(spec.origin)) == os.path.realpath(sys.argv[1]) else 1)
PY
then
    log "registering horovod_gradcomp (editable, $HGC_ROOT)"
    (cd "$HGC_ROOT" && HGC_WITH_NATIVE=0 HGC_WITH_TWIN=0 "$PY" -m pip install -q --no-build-isolation --no-deps -e .)
fi
phase register

# Wait for the background build of _C (when one was started), then check the install from outside the tree.
if [ -n "$build_pid" ]; then
    rc=0; wait "$build_pid" || rc=$?
    build_pid=""
    grep -v -E "^(WARNING: Location|$)" "$build_log" | tail -n 40 || true
    [ "$rc" -eq 0 ] || { log "building horovod_gradcomp._C failed (rc=$rc, log $build_log)"; exit 1; }
    rm -f "$build_log"
fi
(cd / && "$PY" -c "import horovod_gradcomp as h; assert h.native_available(), h.native_error(); print('[ci/install_python] horovod_gradcomp', h.__version__, 'native extension loaded from', h.native._C.__file__)")
phase build_C_wait
log "phases: ${phases[*]}; total $(( $(date +%s) - t_all ))s"
