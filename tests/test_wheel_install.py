"""The package as a user installs it into an environment of their own (issue 33, docs/guide/install.md).

A wheel is built from this tree (``pip wheel --no-build-isolation``, as the Install page says;
pip builds in the tree, so ninja reuses the objects of ``make install``'s build in build/) and
installed into a second, separate venv. That venv sees the first one's site-packages (torch,
mpi4py, Horovod) through a ``.pth`` file naming the directory: Python adds such a directory to
``sys.path`` without processing the ``.pth`` files inside it, so the editable install's finder of
this checkout is not active there. The test checks that, then runs a codec (native against the
pure-torch reference) and a 2-process Horovod exchange from the installed wheel, from a working
directory outside the tree and with no PYTHONPATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The wheel's build reuses make install's objects in build/ (under a minute); on a tree without them it
# compiles _C from scratch, minutes on two cores: the module fixture runs under the first test's limit.
pytestmark = pytest.mark.timeout(1500)

CODEC = r"""
import os, sys, torch, horovod_gradcomp as hgc
assert hgc.__file__.startswith(sys.prefix), f"imported from {hgc.__file__}, not the venv {sys.prefix}"
assert hgc.native_available(), hgc.native_error()
g = torch.Generator().manual_seed(0)
x = torch.randn(37, 19, generator=g)
for name in ("onebit", "terngrad", "qsgd", "dgc"):
    opts = {} if name == "onebit" else {"seed": 3}
    nat, ref = hgc.get_codec(name, **opts), hgc.get_codec(name, impl="reference", **opts)
    p = nat.encode(x)                   # the native kernels of the installed _C
    y = nat.decode(p)
    assert y.shape == x.shape and torch.isfinite(y).all() and y.abs().sum() > 0, name
    assert torch.equal(y, ref.decode(p)), f"{name}: native and reference decode one payload differently"
    if name in ("terngrad", "qsgd"):     # seeded: the reference encodes the same bytes
        q = ref.encode(x)
        assert all(torch.equal(p.buffers[k], q.buffers[k]) for k in p.buffers), f"{name}: payloads differ"
print("codecs ok", hgc.native._C.__file__)
"""

EXCHANGE = r"""
import sys, torch, torch.nn.functional as F
import horovod.torch as hvd
import horovod_gradcomp as hgc
assert hgc.__file__.startswith(sys.prefix), hgc.__file__
hvd.init()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
compression = hgc.Compression.onebit(model.named_parameters())
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                               named_parameters=model.named_parameters(), compression=compression)
torch.manual_seed(100 + hvd.rank())          # each rank its own data: the exchange must agree them
for _ in range(5):
    opt.zero_grad(); F.cross_entropy(model(torch.randn(8, 16)), torch.randint(0, 4, (8,))).backward(); opt.step()
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
every = hvd.allgather(flat.unsqueeze(0))
assert hvd.size() == 2 and torch.equal(every[0], every[1]), "ranks' parameters differ after the exchange"
stats = compression.stats()
assert stats, "no exchange was recorded"
if hvd.rank() == 0:
    print("exchange ok", hgc.__file__)
"""


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMP_NUM_THREADS="1", **extra)
    return env


def _run(cmd, cwd, timeout, env=None):
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env or _clean_env(), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{' '.join(map(str, cmd))} timed out after {timeout}s\n{e.stdout}\n{e.stderr}")
    assert proc.returncode == 0, (f"$ {' '.join(map(str, cmd))}\nrc={proc.returncode}\n"
                                  f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-6000:]}")
    return proc


@pytest.fixture(scope="module")
def venv2(tmp_path_factory):
    """A second venv with this tree's wheel installed; torch, mpi4py, Horovod from the first one."""
    tmp = tmp_path_factory.mktemp("wheel_install")
    wheels = tmp / "wheels"
    # A twin built into build/lib.* (as setup.py did before the twin became a test-time build into
    # build/twin-lib) would be packed into the wheel: a user's install holds no twin.
    for stale in ROOT.glob("build/lib.*/horovod_gradcomp/_C_twin*"):
        stale.unlink()
    # HGC_WITH_TWIN=0: what a user gets (the twin is a test-time build of a checkout); PATH: the venv's ninja.
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps", "-w", str(wheels),
          str(ROOT)], cwd=ROOT, timeout=1200, env=_clean_env(HGC_WITH_TWIN="0", MAX_JOBS=str(os.cpu_count() or 2),
                                              PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"))
    wheel = sorted(wheels.glob("horovod_gradcomp-*.whl"))
    assert len(wheel) == 1, f"expected one wheel, got {wheel}"
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel[0])], capture_output=True,
                           text=True, check=True).stdout
    assert "horovod_gradcomp/_C." in names and "_C_twin" not in names, names

    venv = tmp / "venv2"
    base = getattr(sys, "_base_executable", sys.executable)
    _run([base, "-m", "venv", "--without-pip", str(venv)], cwd=tmp, timeout=120)
    py = venv / "bin" / "python"
    site2 = Path(subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip())
    (site2 / "first_venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    # Before the wheel: torch is visible, this checkout is not (the first venv's editable finder is a
    # .pth inside a directory added by a .pth, which Python does not process).
    probe = _run([py, "-c", "import importlib.util as u, torch, mpi4py, horovod; "
                  "print(u.find_spec('horovod_gradcomp'))"], cwd=tmp, timeout=120)
    assert probe.stdout.strip() == "None", f"the checkout is importable from the second venv: {probe.stdout}"

    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index", str(wheel[0])],
         cwd=tmp, timeout=300)
    return py, tmp


def test_a_codec_runs_from_the_wheel(venv2):
    py, tmp = venv2
    proc = _run([py, "-c", CODEC], cwd=tmp, timeout=300)
    assert "codecs ok" in proc.stdout and str(ROOT) not in proc.stdout, proc.stdout


def test_a_two_process_exchange_runs_from_the_wheel(venv2):
    py, tmp = venv2
    assert shutil.which("mpirun"), "mpirun not found: run ci/install_system.sh"
    script = tmp / "exchange.py"
    script.write_text(EXCHANGE)
    proc = _run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", str(py), str(script)], cwd=tmp,
                timeout=300)
    assert "exchange ok" in proc.stdout and str(ROOT) not in proc.stdout, proc.stdout
