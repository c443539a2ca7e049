#!/usr/bin/env bash
# Builds, on a machine with network and nvcc but no GPU, the extensions for the GPU image that
# ci/gpu_check.sh runs on (Python $GPU_PYTHON_VERSION, torch $GPU_TORCH_SPEC; nothing can be
# downloaded or built quickly there), so that the GPU machine's time goes to the checks:
#   _C (CPU kernels + CUDA kernels for $TORCH_CUDA_ARCH_LIST, default 9.0 = H100/H200) and
#   _C_twin (the same device code on Thrust's OpenMP backend),
# stripped, into $GPU_PREBUILT (default gpu_prebuilt/, gitignored). Carry it with the device tool
# (`carry: ["gpu_prebuilt", "gpu_wheels"]`) and run `ci/gpu_check.sh prebuilt ...` instead of `build`.
# The venv ($GPU_IMAGE_VENV) needs a Python of that version (pyenv's is used when present) and
# holds the CUDA torch of the image (~4 GB with its CUDA wheels); it is reused.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/ci/env.sh"
pyver="${GPU_PYTHON_VERSION:-3.12}"
spec="${GPU_TORCH_SPEC:-torch==2.11.0}"
venv="${GPU_IMAGE_VENV:-$HGC_CACHE/venv-gpu-image-py$pyver-$(printf '%s' "$spec" | tr -c 'A-Za-z0-9.=_-' '_')}"
dest="${GPU_PREBUILT:-$ROOT/gpu_prebuilt}"
build="${GPU_IMAGE_BUILD:-$ROOT/build-gpu-image}"
log() { echo "[ci/build_for_gpu_image] $*"; }
if [ ! -x "$venv/bin/python" ]; then
    py=$(command -v "python$pyver" || true)
    if [ -z "$py" ] || ! "$py" -V >/dev/null 2>&1; then
        py=$(ls -d "$HOME"/.pyenv/versions/"$pyver".*/bin/python"$pyver" 2>/dev/null | tail -1)
    fi
    [ -n "$py" ] || { log "no Python $pyver here (the GPU image's); install one (e.g. pyenv) first"; exit 1; }
    "$py" -m venv "$venv"
fi
PYC="$venv/bin/python"
"$PYC" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null ||
    "$PYC" -m pip install -q "$spec" "setuptools<82" wheel ninja numpy packaging
"$PYC" -c "import torch; print('[ci/build_for_gpu_image] python', __import__('sys').version.split()[0], 'torch', torch.__version__)"
site=$("$PYC" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for inc in "$site"/nvidia/cu13/include "$site"/nvidia/*/include; do
    [ -d "$inc" ] && CPATH="${CPATH:+$CPATH:}$inc"
done
export CPATH="${CPATH:-}" CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}" HGC_WITH_CUDA=1 HGC_WITH_TWIN=1 PATH="$CUDA_HOME/bin:$PATH"
s=$(date +%s)
(cd "$ROOT" && "$PYC" setup.py -q build_ext --build-lib "$build/lib" --build-temp "$build/tmp")
log "build took $(( $(date +%s) - s )) s"
mkdir -p "$dest"
rm -f "$dest"/_C*.so
for so in "$build"/lib/horovod_gradcomp/_C*.so; do
    strip --strip-debug -o "$dest/$(basename "$so")" "$so"
done
git -C "$ROOT" rev-parse HEAD > "$dest/SOURCE_COMMIT"
git -C "$ROOT" status --porcelain -- csrc setup.py | sed 's/^/uncommitted: /' >> "$dest/SOURCE_COMMIT"
ls -la "$dest"
