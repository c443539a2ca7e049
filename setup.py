"""Build horovod_gradcomp and its native extension horovod_gradcomp._C.

CppExtension from csrc/cpu (always); CUDAExtension adding the device sources
(csrc/device/*.cu, Thrust) when PyTorch was built with CUDA and nvcc is found (set
HGC_WITH_CUDA=0 to skip, =1 to insist).

horovod_gradcomp._C_twin: the same device sources built by g++ with Thrust's OpenMP backend
(csrc/twin/), so that the tests run the GPU path's algorithms on the CPU. A test-time build: not
built by an install unless HGC_WITH_TWIN=1 (needs CCCL's headers: the CUDA toolkit's
include/cccl, or the nvidia-cuda-cccl wheel); HGC_WITH_TWIN=only builds it alone (what
`make test` runs, ci/build_twin.sh). HGC_WITH_NATIVE=0 builds no extension at all (the install
script registers the package that way, then builds _C in place with ninja: one build, kept in
build/ for incremental rebuilds).
"""
import glob
import os

from setuptools import find_packages, setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))


def _version():
    scope = {}
    with open(os.path.join(ROOT, "horovod_gradcomp", "_version.py")) as f:
        exec(f.read(), scope)
    return scope["__version__"]


# --fmad=false: no fused multiply-add in the kernels either, so that CUDA and CPU round alike
# (the wire format and decoded values are bit-for-bit those of the CPU kernels).
NVCC_FLAGS = ["-O3", "--fmad=false"]


def _want_cuda():
    flag = os.environ.get("HGC_WITH_CUDA")
    available = cpp_extension.CUDA_HOME is not None and __import__("torch").version.cuda is not None
    if flag == "1" and not available:
        raise RuntimeError("HGC_WITH_CUDA=1 but PyTorch has no CUDA or nvcc was not found")
    return available if flag is None else flag == "1"


def cxx_standard(torch_version=None):
    """The C++ standard the installed PyTorch's headers need: "c++20" from torch 2.14 on
    (its headers stop with "#error C++20 or later compatible compiler is required"), else
    "c++17". HGC_CXX_STD (e.g. "c++20") overrides."""
    forced = os.environ.get("HGC_CXX_STD")
    if forced:
        return forced
    if torch_version is None:
        torch_version = __import__("torch").__version__
    major, minor = (int(p) for p in torch_version.split("+")[0].split(".")[:2])
    return "c++20" if (major, minor) >= (2, 14) else "c++17"


def cccl_include():
    """The directory holding CCCL's thrust/, cub/ and cuda/ headers: the CUDA toolkit's (the
    CCCL nvcc uses, so both builds compile one Thrust), else the nvidia-cuda-cccl wheel's; None."""
    roots = [os.environ.get("CUDA_HOME"), cpp_extension.CUDA_HOME, "/usr/local/cuda"]
    for root in roots:
        if root and os.path.isfile(os.path.join(root, "include", "cccl", "thrust", "version.h")):
            return os.path.join(root, "include", "cccl")
    try:
        import nvidia  # the namespace package of NVIDIA's wheels
        for base in nvidia.__path__:
            for cand in sorted(glob.glob(os.path.join(base, "*", "include", "cccl"))):
                if os.path.isfile(os.path.join(cand, "thrust", "version.h")):
                    return cand
    except ImportError:
        pass
    return None


def twin_extension():
    """_C_twin (see the module doc); raises naming the fix when CCCL's headers are missing."""
    inc = cccl_include()
    if inc is None:
        raise RuntimeError(f"HGC_WITH_TWIN={os.environ.get('HGC_WITH_TWIN')} but CCCL's headers were not found "
                           "(install the CUDA toolkit or `pip install nvidia-cuda-cccl`)")
    return cpp_extension.CppExtension("horovod_gradcomp._C_twin", sorted(glob.glob("csrc/twin/*.cpp")),
                                      include_dirs=twin_include_dirs(inc), extra_compile_args={"cxx": twin_cxx_flags()},
                                      extra_link_args=["-fopenmp"])


def twin_include_dirs(cccl):
    """CCCL's directory, then the CUDA toolkit's include/ when there is one: CCCL includes
    cuda_runtime_api.h whenever the compiler can find one (a CPATH holding NVIDIA's wheel headers
    is enough), and that header needs the toolkit's crt/ beside it."""
    dirs = [cccl]
    cuda_inc = os.path.join(os.path.dirname(cccl), "")
    if os.path.isfile(os.path.join(cuda_inc, "crt", "host_defines.h")):
        dirs.append(os.path.normpath(cuda_inc))
    return dirs


def twin_cxx_flags():
    """g++ flags of the twin: Thrust's OpenMP backend, HGC_TWIN, no contraction (as the CPU kernels
    and nvcc's --fmad=false: every product and sum rounds on its own)."""
    return ["-O2", "-ffp-contract=off", "-std=" + cxx_standard(), "-fopenmp", "-Wno-c++20-extensions",
            "-DTHRUST_DEVICE_SYSTEM=THRUST_DEVICE_SYSTEM_OMP", "-DHGC_TWIN"]


def extension():
    sources = ["csrc/binding.cpp"] + sorted(glob.glob("csrc/cpu/*.cpp"))
    # -fno-trapping-math lets gcc turn the kernels' float selects into vector blends.
    # -ffp-contract=off: no fused multiply-add, so native and reference round alike everywhere.
    # -Wno-c++20-extensions: torch 2.13 headers use C++20 bit-field initializers (noise only).
    std = "-std=" + cxx_standard()
    cxx = ["-O3", "-fno-trapping-math", "-ffp-contract=off", std, "-fopenmp", "-Wno-c++20-extensions"]
    link = ["-fopenmp"]
    if _want_cuda():
        # csrc/device/*.cu: the Thrust sources (no PyTorch headers); csrc/device/*_ops.cpp: their
        # torch ops (the same files the twin builds for the CPU).
        sources += sorted(glob.glob("csrc/device/*.cu")) + sorted(glob.glob("csrc/device/*_ops.cpp"))
        return cpp_extension.CUDAExtension(
            "horovod_gradcomp._C", sources, define_macros=[("WITH_CUDA", None)],
            extra_compile_args={"cxx": cxx, "nvcc": NVCC_FLAGS + [std]}, extra_link_args=link)
    return cpp_extension.CppExtension("horovod_gradcomp._C", sources,
                                      extra_compile_args={"cxx": cxx}, extra_link_args=link)


def ext_modules():
    """The extensions this build makes, from the switches HGC_WITH_NATIVE (default 1: _C) and
    HGC_WITH_TWIN (default 0; 1: _C_twin too; only: _C_twin alone). Unknown values raise."""
    native, twin = os.environ.get("HGC_WITH_NATIVE", "1"), os.environ.get("HGC_WITH_TWIN", "0")
    if native not in ("0", "1") or twin not in ("0", "1", "only"):
        raise RuntimeError(f"HGC_WITH_NATIVE must be 0 or 1 (got {native!r}), HGC_WITH_TWIN 0, 1 or only "
                           f"(got {twin!r})")
    exts = []
    if native == "1" and twin != "only":
        exts.append(extension())
    if twin != "0":
        exts.append(twin_extension())
    return exts


if __name__ == "__main__":  # (imported by ci/build_twin_dev.py for the flags)
    setup(
        name="horovod_gradcomp",
        version=_version(),
        description="Gradient compression (1-bit SGD, TernGrad, QSGD, DGC) for Horovod + PyTorch under MPI",
        packages=find_packages(include=["horovod_gradcomp", "horovod_gradcomp.*"]),
        ext_modules=ext_modules(),
        cmdclass={"build_ext": cpp_extension.BuildExtension},
        python_requires=">=3.9",
        install_requires=["torch", "mpi4py", "numpy"],
        extras_require={"test": ["pytest", "pytest-timeout", "scikit-learn", "tqdm"]},
    )
