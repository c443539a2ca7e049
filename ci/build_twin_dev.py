"""Build a private copy of the OpenMP twin (_C_twin) from a subset of the codecs' device sources.

For work on one codec's device path while other codecs' sources are in flux:

    .venv/bin/python ci/build_twin_dev.py onebit --build-dir /tmp/twin_onebit
    HGC_TWIN_PATH=/tmp/twin_onebit/_C_twin.so .venv/bin/python -m pytest tests/test_cuda_codecs.py -k onebit

Same sources layout, headers and flags as setup.py's twin extension (which builds the whole
twin into the package). HGC_TWIN_PATH makes horovod_gradcomp.native load the given file as
horovod_gradcomp._C_twin.
"""
from __future__ import annotations

import argparse
import glob
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("codecs", nargs="*", help="codecs whose csrc/twin/<codec>_twin.cpp to include (default: all)")
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--sanitize", choices=["address"], default=None,
                    help="instrument with AddressSanitizer (-O1 -g; run with libasan preloaded)")
    args = ap.parse_args(argv)
    sys.path.insert(0, ROOT)
    os.chdir(ROOT)
    from torch.utils import cpp_extension

    import setup as build  # setup.py: its helpers, without running setup()

    inc = build.cccl_include()
    if inc is None:
        ap.error("CCCL's headers were not found (CUDA toolkit or `pip install nvidia-cuda-cccl`)")
    sources = ["csrc/twin/binding_twin.cpp", "csrc/twin/exec_twin.cpp"]
    if args.codecs:
        sources += [f"csrc/twin/{c}_twin.cpp" for c in args.codecs]
    else:
        sources = sorted(glob.glob("csrc/twin/*.cpp"))
    cflags, ldflags = build.twin_cxx_flags(), ["-fopenmp"]
    if args.sanitize == "address":
        cflags += ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"]
        ldflags += ["-fsanitize=address"]
    os.makedirs(args.build_dir, exist_ok=True)
    cpp_extension.load(name="_C_twin", sources=[os.path.join(ROOT, s) for s in sources],
                       extra_include_paths=build.twin_include_dirs(inc), extra_cflags=cflags, extra_ldflags=ldflags,
                       build_directory=args.build_dir, verbose=False)
    print(os.path.join(args.build_dir, "_C_twin.so"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
