#!/usr/bin/env bash
# Creates $VENV and installs, idempotently: torch (pinned, overridable by TORCH_SPEC),
# mpi4py, Horovod built with PyTorch + MPI + Gloo, the test/example dependencies, and
# horovod_gradcomp itself with its native extension (editable install via setup.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
log() { echo "[ci/install_python] $*"; }

[ -x "$PY" ] || { log "creating $VENV"; "$PYTHON_BOOT" -m venv "$VENV"; }
pipi() { "$PY" -m pip install -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
    log "installing $TORCH_SPEC"; pipi "$TORCH_SPEC"
fi
TORCH_VERSION=$("$PY" -c "import torch; print(torch.__version__)")

# Build-time and test/example dependencies (cheap when present: pip only checks).
pipi "setuptools>=68" wheel ninja packaging numpy "$MPI4PY_SPEC" pytest pytest-timeout \
     scikit-learn tqdm psutil pyyaml cloudpickle cffi matplotlib
# The launchers DDP users come from (tests of the comm hook under each) and the docs site's tools.
pipi lightning accelerate mkdocs mkdocs-material "mkdocstrings[python]"

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
    wheel_dir="$HGC_CACHE/wheels/horovod-$HOROVOD_VERSION-mpi-gloo-torch-$TORCH_VERSION"
    if ! ls "$wheel_dir"/horovod-*.whl >/dev/null 2>&1; then
        log "building Horovod $HOROVOD_VERSION against torch $TORCH_VERSION (takes a few minutes)"
        mkdir -p "$wheel_dir"
        "$(dirname "${BASH_SOURCE[0]}")/build_horovod.sh" "$wheel_dir"
    fi
    log "installing Horovod from $wheel_dir"
    pipi --no-deps --force-reinstall "$wheel_dir"/horovod-*.whl
    horovod_ok || { log "Horovod installed but lacks MPI or Gloo"; exit 1; }
fi

# horovod_gradcomp itself; setup.py builds horovod_gradcomp._C. Rebuilt when it does not
# load, when a native source is newer than the built module, or when HGC_REBUILD is set.
so=$(ls "$HGC_ROOT"/horovod_gradcomp/_C*.so 2>/dev/null | head -1 || true)
stale=""
if [ -z "$so" ] || [ -n "$(find "$HGC_ROOT/csrc" "$HGC_ROOT/setup.py" -newer "$so" -type f 2>/dev/null | head -1)" ]; then
    stale=1
fi
if [ -n "$stale" ] || [ -n "${HGC_REBUILD:-}" ] \
   || ! "$PY" -c "import horovod_gradcomp as h, sys; sys.exit(0 if h.native_available() else 1)" 2>/dev/null; then
    log "building horovod_gradcomp and its native extension"
    (cd "$HGC_ROOT" && "$PY" -m pip install -q --no-build-isolation -e . && "$PY" setup.py -q build_ext --inplace)
fi
"$PY" -c "import horovod_gradcomp as h; assert h.native_available(), h.native_error(); print('[ci/install_python] horovod_gradcomp', h.__version__, 'native extension loaded')"
