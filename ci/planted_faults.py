"""Plant a one-line fault in each shared native helper and show that the oracle tests catch it.

The shared helpers (csrc/device/onebit_functors.h's finish_column and summation order,
csrc/device/terngrad_functors.h's BlockSum and random stream, csrc/splitmix64.h,
csrc/elias_bit_reader.h, csrc/dgc_accumulate_step.h) are compiled into both the CPU kernels and
the twin, so the bitwise twin-vs-CPU tests cannot see a bug in them; tests/test_shared_oracles.py
checks them against numpy models instead. For each fault this script copies the tree (git's
files) to WORK/<fault>/tree, replaces one line there, builds the smallest twin that holds the
helper (csrc/twin/binding_twin.cpp + exec_twin.cpp, built once from the clean tree, plus the one
codec's csrc/twin/<codec>_twin.cpp from the faulty copy, the flags of setup.py's twin), and runs
the helper's oracle tests from this tree against that twin (HGC_TWIN_PATH). A fault counts as
caught when the tests fail. Not part of `make test` (each build takes minutes):

    nice -n 19 .venv/bin/python ci/planted_faults.py --work /tmp/hgc_planted_faults [--jobs 2] [fault ...]

Prints one markdown table row per fault (and writes them to WORK/results.md).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (helper, file, original line (exact, once in the file), faulty line, codec, pytest -k)
FAULTS = {
    "finish_column": (
        "finish_column (a+ rounded twice)", "csrc/device/onebit_functors.h",
        "  *a_pos = cnt > 0 ? static_cast<float>(p / cnt) : 0.f;",
        "  *a_pos = cnt > 0 ? static_cast<float>(p) / static_cast<float>(cnt) : 0.f;",
        "onebit", "onebit and twin"),
    "onebit_lanes": (
        "onebit summation order (lanes of a one-column tensor)", "csrc/device/onebit_functors.h",
        "constexpr int64_t kLanes = 16;      // columns of a one-column tensor's view",
        "constexpr int64_t kLanes = 8;       // columns of a one-column tensor's view",
        "onebit", "onebit and twin"),
    "terngrad_blocksum": (
        "TernGrad BlockSum (block summed backwards)", "csrc/device/terngrad_functors.h",
        "    for (int64_t j = lo; j < hi; ++j) acc = acc + in[j];",
        "    for (int64_t j = hi - 1; j >= lo; --j) acc = acc + in[j];",
        "terngrad", "terngrad and sums and twin"),
    "terngrad_stream": (
        "TernGrad random stream (mix32's first shift)", "csrc/device/terngrad_functors.h",
        "  x ^= x >> 16;", "  x ^= x >> 17;",
        "terngrad", "terngrad and stream and twin"),
    "splitmix64": (
        "splitmix64 (mix64's last shift)", "csrc/splitmix64.h",
        "  return z ^ (z >> 31);", "  return z ^ (z >> 30);",
        "qsgd", "qsgd and stream and twin"),
    "elias_reader": (
        "Elias bit reader (gamma's fast path skips one bit short)", "csrc/elias_bit_reader.h",
        "      pos += 2 * N + 1;", "      pos += 2 * N;",
        "qsgd", "elias and twin"),
    "dgc_accumulate": (
        "DGC accumulate step (nesterov adds u, not u * m)", "csrc/dgc_accumulate_step.h",
        "    v = vh + mun;", "    v = vh + un;",
        "dgc", "dgc_accumulate and twin"),
}


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def tree_copy(dest: str) -> None:
    """The git files of ROOT (as in the working tree) copied to dest."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, check=True, capture_output=True).stdout
    os.makedirs(dest, exist_ok=True)
    for rel in filter(None, files.decode().split("\0")):
        src = os.path.join(ROOT, rel)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, rel))


def flags():
    """(compile flags, link flags) of setup.py's twin extension."""
    sys.path.insert(0, ROOT)
    from torch.utils import cpp_extension

    import setup as build  # setup.py's helpers, without running setup()

    inc = build.cccl_include()
    if inc is None:
        raise SystemExit("CCCL's headers were not found (CUDA toolkit or `pip install nvidia-cuda-cccl`)")
    import sysconfig

    incs = build.twin_include_dirs(inc) + cpp_extension.include_paths() + [sysconfig.get_paths()["include"]]
    cflags = ["-fPIC", "-DTORCH_EXTENSION_NAME=_C_twin", "-DTORCH_API_INCLUDE_EXTENSION_H"]
    cflags += [f"-I{d}" for d in incs] + build.twin_cxx_flags()
    ldflags = ["-shared", "-fopenmp"] + [f"-L{d}" for d in cpp_extension.library_paths()]
    ldflags += ["-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]
    return cflags, ldflags


def compile_one(cflags, src: str, obj: str) -> None:
    if not os.path.exists(obj):
        run(["c++"] + cflags + ["-c", src, "-o", obj + ".tmp"])
        os.replace(obj + ".tmp", obj)


def build_fault(name: str, work: str, common: str, cflags, ldflags) -> str:
    """The twin of the fault's codec built from a faulty copy; returns the .so path. An object
    already in WORK/<fault> is reused (remove WORK to rebuild)."""
    helper, path, orig, faulty, codec, _ = FAULTS[name]
    d = os.path.join(work, name)
    tree = os.path.join(d, "tree")
    tree_copy(tree)
    with open(os.path.join(tree, path)) as f:
        text = f.read()
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if line == orig]
    if len(hits) != 1:
        raise SystemExit(f"{name}: the line to fault occurs {len(hits)} times in {path}: {orig!r}")
    lines[hits[0]] = faulty
    with open(os.path.join(tree, path), "w") as f:
        f.write("\n".join(lines))
    obj = os.path.join(d, f"{codec}_twin.o")
    compile_one(cflags, os.path.join(tree, "csrc", "twin", f"{codec}_twin.cpp"), obj)
    so = os.path.join(d, "_C_twin.so")
    run(["c++", os.path.join(common, "binding_twin.o"), os.path.join(common, "exec_twin.o"), obj] + ldflags +
        ["-o", so])
    return so


def oracle_tests(so: str | None, select: str) -> tuple:
    """(exit status, pytest's summary line and its first failing test) of the oracle tests `select`
    against the twin `so`."""
    env = dict(os.environ, PYTHONPATH=ROOT)
    if so:
        env["HGC_TWIN_PATH"] = so
    p = subprocess.run([sys.executable, "-m", "pytest", "tests/test_shared_oracles.py", "-q", "-p", "no:cacheprovider",
                        "-rf", "-k", select], cwd=ROOT, env=env, capture_output=True, text=True)
    lines = [line for line in p.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else p.stderr.strip()[-200:]
    failed = [line.split(" - ")[0].split("::")[-1] for line in lines if line.startswith("FAILED ")]
    return p.returncode, summary + (f"; first: `{failed[0]}`" if failed else "")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("faults", nargs="*", help=f"default: all of {', '.join(FAULTS)}")
    ap.add_argument("--work", required=True, help="scratch directory (trees, objects, twins)")
    ap.add_argument("--jobs", type=int, default=1, help="faults built at once")
    args = ap.parse_args(argv)
    names = args.faults or list(FAULTS)
    for n in names:
        if n not in FAULTS:
            ap.error(f"unknown fault {n!r}; known: {', '.join(FAULTS)}")
    os.makedirs(args.work, exist_ok=True)
    cflags, ldflags = flags()
    common = os.path.join(args.work, "common")
    if not all(os.path.exists(os.path.join(common, f"{s}_twin.o")) for s in ("binding", "exec")):
        clean = os.path.join(common, "tree")
        tree_copy(clean)
        for s in ("binding", "exec"):
            compile_one(cflags, os.path.join(clean, "csrc", "twin", f"{s}_twin.cpp"),
                        os.path.join(common, f"{s}_twin.o"))
    rows = ["| fault | file: original -> planted line | oracle tests (-k) | result | build s |",
            "|---|---|---|---|---|"]
    out = os.path.join(args.work, "results.md")

    def one(name):
        t0 = time.time()
        so = build_fault(name, args.work, common, cflags, ldflags)
        return name, so, time.time() - t0

    with cf.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        for fut in cf.as_completed([pool.submit(one, n) for n in names]):
            name, so, secs = fut.result()
            helper, path, orig, faulty, codec, select = FAULTS[name]
            rc, summary = oracle_tests(so, select)
            verdict = "CAUGHT (tests fail)" if rc == 1 else ("NOT CAUGHT (tests pass)" if rc == 0 else f"error rc={rc}")
            row = (f"| {helper} | `{path}`: `{orig.strip()}` -> `{faulty.strip()}` | `{select}` | "
                   f"{verdict}: {summary} | {secs:.0f} |")
            rows.append(row)
            print(row, flush=True)
            with open(out, "a") as f:
                f.write(row + "\n")
    print("\n".join(rows))
    return 0 if all("CAUGHT (tests fail)" in r for r in rows[2:]) else 1


if __name__ == "__main__":
    sys.exit(main())
