#!/usr/bin/env bash
# Installs the system packages horovod_gradcomp needs: Open MPI (runtime and headers,
# from Debian's packages), cmake (Horovod's Gloo build) and iproute2 (network namespaces
# for the slow-network bench), clang with its sanitizer runtimes and LLVM's OpenMP runtime (the ThreadSanitizer run of
# the device kernels' OpenMP twin: libomp's Archer tells TSan about OpenMP's synchronization), and
# ccache (the native builds' compiler cache, ci/env.sh).
# Idempotent: packages already installed are left alone.
set -euo pipefail

pkgs=(libopenmpi-dev openmpi-bin cmake iproute2 clang libomp-dev libclang-rt-14-dev ccache)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "[ci/install_system] system packages present: ${pkgs[*]}"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "[ci/install_system] need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
fi
echo "[ci/install_system] installing: ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
